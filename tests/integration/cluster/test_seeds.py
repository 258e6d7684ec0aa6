"""Must show 6: a service pointed at a Redis Cluster through a URL that names a replica, or a
list of seeds whose first node is down, starts once a seed answers, serves calls, and its start
line says which seed gave it the map and how many primaries it found. The CLI given the same
URL finds the cluster too, and so does a `Worker` given one node's URL (it asks the node once
at start, as the service and StateClient do: without that its first MOVED stopped it)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest

from stateworker import StateClient, Worker
from stateworker.bus.protocol import BusOptions, Call
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from tests.cluster import RedisCluster
from tests.servers import free_port

pytestmark = pytest.mark.anyio

PARTITIONS = 4
SHARDS = 3


def environment(prefix: str) -> dict[str, str]:
    return {**os.environ, "STATEWORKER_PREFIX": prefix,
            "STATEWORKER_PARTITIONS": str(PARTITIONS), "STATEWORKER_BUS_SHARDS": str(SHARDS)}


@contextmanager
def serving(url: str, prefix: str) -> Iterator[dict[str, Any]]:
    """`stateworker serve` on `url` in a process of its own; its start line (JSON). Stopped
    with SIGTERM afterwards: it must exit 0."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stateworker", "--redis-url", url, "serve", "--log-level",
         "WARNING"], env=environment(prefix), stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    assert process.stdout is not None
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "the service printed no start line within 60 s"
        line = process.stdout.readline()
        assert line, "the service ended before it served"
        yield json.loads(line)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def cli(url: str, prefix: str, *args: str) -> str:
    """One `stateworker` command on `url`; its stdout (exit status 0 asserted)."""
    done = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", url, *args],
                          env=environment(prefix), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def seeds_for(cluster: RedisCluster, how: str) -> tuple[str, str]:
    """(the URL the service is given, the seed that must answer)."""
    if how == "a replica's url":
        replica = cluster.replicas()[0].url
        return replica, replica
    answering = cluster.primaries()[0].url
    return f"redis://127.0.0.1:{free_port()},{answering}", answering


@pytest.mark.parametrize("how", ["a replica's url", "first seed down"])
def test_serve_starts_from_the_seed_that_answers_and_says_which(
        redis_cluster: RedisCluster, prefix: str, how: str) -> None:
    url, answering = seeds_for(redis_cluster, how)
    with serving(url, prefix) as started:
        assert started["serving"] == "state" and started["redis"] == url
        assert started["cluster_seed"] == answering
        assert started["primaries"] == "3" and started["shards"] == SHARDS
        # The CLI, given the same URL, finds the cluster as well (its verbs are StateClient
        # calls: every partition, so every primary and bus shard, is in test_client.py).
        assert json.loads(cli(url, prefix, "put", "s", "k", "7"))["version"] == 1
        assert cli(url, prefix, "get", "s", "k") == "7"
        report = json.loads(cli(url, prefix, "status", "--output", "json"))
        assert report["reachable"] is True  # (each partition's lease read on its primary)
        assert [p["partition"] for p in report["dispatch"]["partitions"]] == list(
            range(PARTITIONS))


async def test_a_worker_given_one_nodes_url_finds_the_cluster(
        redis_cluster: RedisCluster, prefix: str) -> None:
    """The node is a replica: every command sent to it as to one server is MOVED."""
    replica = redis_cluster.replicas()[0].url
    worker = Worker("echo", settings=Settings(redis_url=replica, prefix=prefix,
                                              partitions=PARTITIONS, bus_shards=SHARDS),
                    options=BusOptions(block_ms=50))

    @worker.function("echo::back")
    async def back(body: Any, call: Call) -> Any:
        return body

    caller = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=PARTITIONS,
                      bus_shards=SHARDS)
    async with anyio.create_task_group() as tg, \
            StateClient(settings=caller, service="echo", timeout=30) as client:
        with anyio.fail_after(60):
            await tg.start(worker.run)
        assert worker.runtime is not None
        assert isinstance(worker.runtime.conn, ClusterConnection)
        bodies = [{"scope": f"s{n}", "n": n} for n in range(12)]  # (every shard)
        assert [await client.call("echo::back", body) for body in bodies] == bodies
        worker.stop()
