"""compose.cluster.yaml at the top level: six Redis nodes in cluster mode (AOF on, a volume
each), `cluster-init` that joins them once (3 primaries, 1 replica each), Postgres and the
service as in compose.yaml, three `stateworker serve` replicas on a seed list with three bus
shards, started once cluster-init has succeeded. The structure is read with PyYAML every run
(`docker compose config -q` as well where Compose is installed, as test_compose.py does), and
cluster-init's own script runs here against real redis-server nodes: it forms a cluster of
six empty nodes, and on a cluster already formed it changes nothing and exits 0."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
import yaml

from tests.cluster import RedisCluster
from tests.integration.service.test_compose import ROOT, compose, compose_commands
from tests.servers import wait_until

NODES = [f"redis-{n}" for n in range(1, 7)]


def cluster_compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "compose.cluster.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_six_cluster_nodes_with_aof_each_on_its_own_volume() -> None:
    spec = cluster_compose()
    services, volumes = spec["services"], spec["volumes"]
    assert set(services) == {*NODES, "cluster-init", "postgres", "stateworker"}
    assert set(volumes) == {*(f"{node}-data" for node in NODES), "postgres-data"}
    for node in NODES:
        redis = services[node]
        assert redis["image"] == "redis:7"
        command = redis["command"]
        assert command[0] == "redis-server"
        assert option(command, "--cluster-enabled") == "yes"
        assert option(command, "--cluster-config-file").startswith("/data/")  # kept: a restart
        assert option(command, "--appendonly") == "yes"                       # rejoins
        assert option(command, "--appendfsync") == "everysec"
        assert option(command, "--dir") == "/data"
        assert redis["volumes"] == [f"{node}-data:/data"]
        assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_cluster_init_waits_for_the_six_and_runs_once() -> None:
    init = cluster_compose()["services"]["cluster-init"]
    assert init["image"] == "redis:7" and init["restart"] == "no"
    assert init["depends_on"] == {node: {"condition": "service_healthy"} for node in NODES}
    assert init["environment"]["NODES"].split() == [f"{node}:6379" for node in NODES]
    assert init["entrypoint"] == ["sh", "-c"]
    script = init["command"][0]
    assert "redis-cli --cluster create" in script
    assert "--cluster-replicas 1 --cluster-yes" in script


def test_postgres_and_the_service_as_in_compose_yaml_three_replicas_on_seeds() -> None:
    services, single = cluster_compose()["services"], compose()["services"]
    assert services["postgres"] == single["postgres"]  # the same settings, volume, check

    worker, one = services["stateworker"], single["stateworker"]
    for same in ("build", "image", "command", "healthcheck", "restart"):
        assert worker[same] == one[same], same
    assert worker["deploy"]["replicas"] == 3
    assert worker["depends_on"] == {
        "cluster-init": {"condition": "service_completed_successfully"},
        "postgres": {"condition": "service_healthy"}}
    env = worker["environment"]
    assert set(env) == {*one["environment"], "STATEWORKER_BUS_SHARDS"}
    assert worker["expose"] == one["expose"]
    for same in ("STATEWORKER_POSTGRES_URL", "STATEWORKER_DURABILITY", "STATEWORKER_HTTP"):
        assert env[same] == one["environment"][same], same
    assert env["STATEWORKER_BUS_SHARDS"] == "3"  # a string: Compose takes no number there
    seeds = [urlsplit(seed) for seed in env["STATEWORKER_REDIS_URL"].split(",")]
    assert [(seed.scheme, seed.hostname, seed.port) for seed in seeds] == [
        ("redis", node, 6379) for node in NODES[:3]]


def test_compose_accepts_the_file() -> None:
    for command in compose_commands():  # Compose's own check, where it is installed
        checked = subprocess.run([*command, "-f", str(ROOT / "compose.cluster.yaml"), "config",
                                  "-q"], capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, (command, checked.stderr)


# ---- cluster-init's script, run on real nodes ----------------------------------------------
def run_init(ports: list[int]) -> subprocess.CompletedProcess[str]:
    """cluster-init's command as the container runs it (`$$` is Compose's `$`), with NODES
    naming local nodes instead of the compose services."""
    script = cluster_compose()["services"]["cluster-init"]["command"][0].replace("$$", "$")
    nodes = " ".join(f"127.0.0.1:{port}" for port in ports)
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODES": nodes})


def shards_of(cluster: RedisCluster) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
    return sorted((node.node_id, node.slots) for node in cluster.nodes())


class EmptyNodes(RedisCluster):
    """Six cluster-enabled nodes that are not joined yet: cluster-init's job."""

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (scripts/test installs it)"
        for port in self.ports:
            self._start_node(binary, port)
        for port in self.ports:
            wait_until(lambda p=port: self.answers(p), 15, f"cluster node on port {port}")

    def answers(self, port: int) -> bool:
        try:
            with self.client(port) as client:
                return bool(client.ping())
        except redis.ConnectionError:  # (refused while it starts)
            return False


def test_cluster_init_forms_six_empty_nodes_then_leaves_them_as_they_are(
        tmp_path: Path) -> None:
    nodes = EmptyNodes(tmp_path)
    try:
        nodes.start()
        formed = run_init(nodes.ports)
        assert formed.returncode == 0, formed.stdout + formed.stderr
        nodes.wait_healthy()
        assert len(nodes.primaries()) == 3 and len(nodes.replicas()) == 3
        before = shards_of(nodes)

        again = run_init(nodes.ports)  # a later `docker compose up`
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.strip() == "the cluster is formed already"
        assert shards_of(nodes) == before
    finally:
        nodes.kill()


def test_cluster_init_on_a_node_that_does_not_answer_fails(tmp_path: Path) -> None:
    """Nothing to join: cluster-init exits non-zero, so the service replicas do not start
    (`service_completed_successfully`)."""
    nodes = EmptyNodes(tmp_path)  # (not started: nothing listens on its ports)
    failed = run_init(nodes.ports)
    assert failed.returncode != 0
