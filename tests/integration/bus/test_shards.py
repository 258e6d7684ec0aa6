"""A sharded bus (STATEWORKER_BUS_SHARDS=3): calls land on the shard their scope (or, without
one, their id) picks, every shard is read by every replica, a retry on its shard gets the
recorded reply, a sharded worker's trigger handler gets every event, and a kill -9 of a
replica loses no call of any shard. The shard of a call is computed here from the documented
rule (CRC32 of the scope's UTF-8 bytes, mod partitions, mod shards), not from the code."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateStore
from stateworker.app.cli import status_report
from stateworker.app.cli.calls import check_readers
from stateworker.app.cli.status import summary
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import Unavailable
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.servers import RedisServer, ServiceProcess, tcp_quiet

pytestmark = pytest.mark.anyio

SHARDS, PARTITIONS = 3, 4


def sharded(redis_server: RedisServer, prefix: str, shards: int = SHARDS) -> Settings:
    return Settings(redis_url=redis_server.url, prefix=prefix, partitions=PARTITIONS,
                    bus_shards=shards)


def shard_streams(prefix: str, service: str = "state") -> list[str]:
    """The documented names: shard 0 is `<prefix>:bus:<service>`, shard i ends in partition
    i's hash tag."""
    return [f"{prefix}:bus:{service}"] + [f"{prefix}:bus:{service}:{{{prefix}:p{i}}}"
                                          for i in range(1, SHARDS)]


def shard_of_scope(scope: str) -> int:
    return zlib.crc32(scope.encode()) % PARTITIONS % SHARDS


async def added(raw: aredis.Redis, stream: str) -> int:
    """Entries ever added to `stream` (the service deletes answered ones: XLEN would not do)."""
    if not await raw.exists(stream):
        return 0
    return int((await raw.xinfo_stream(stream))["entries-added"])


@asynccontextmanager
async def replicas(settings: Settings, *consumers: str) -> AsyncIterator[list[StateService]]:
    """The state service `len(consumers)` times in this process: replicas of one service."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(StateService.running(
            settings, BusOptions(block_ms=50, consumer=name))) for name in consumers]


def increment(scope: str) -> dict[str, Any]:
    return {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "n", "by": 1}]}


async def test_calls_of_many_clients_land_on_their_shards_each_answered_once(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    settings = sharded(redis_server, prefix)
    scopes = [f"s{i}" for i in range(24)]
    clients, per_client = 8, 30
    results: dict[str, list[int]] = {scope: [] for scope in scopes}
    no_scope_ids = [f"plain-{i}" for i in range(30)]

    async def one_client(n: int) -> None:
        async with StateClient(settings=settings, timeout=30) as client:
            for i in range(per_client):
                scope = scopes[(n * per_client + i) % len(scopes)]
                result = await client.call("state::update", increment(scope))
                results[scope].append(result["new_value"]["n"])

    async with replicas(settings, "r1"):
        async with anyio.create_task_group() as tg:
            for n in range(clients):
                tg.start_soon(one_client, n)
        async with StateClient(settings=settings) as client:  # calls without a scope
            for call_id in no_scope_ids:
                assert isinstance(await client.call("state::list-namespaces", {},
                                                    call_id=call_id), dict)
    want = Counter(shard_of_scope(s) for s in scopes for _ in range(clients * per_client
                                                                    // len(scopes)))
    want.update(zlib.crc32(i.encode()) % SHARDS for i in no_scope_ids)
    got = {n: await added(raw, stream) for n, stream in enumerate(shard_streams(prefix))}
    assert got == {n: want[n] for n in range(SHARDS)}
    assert all(got.values()), "the test's scopes must reach every shard"
    # Each call applied once and answered once: every scope's counter handed out 1..k, each
    # value to one call.
    for scope, values in results.items():
        assert sorted(values) == list(range(1, clients * per_client // len(scopes) + 1)), scope
    for stream in shard_streams(prefix):
        assert (await raw.xpending(stream, "state"))["pending"] == 0


async def test_a_retry_on_its_shard_gets_the_recorded_reply(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    settings = sharded(redis_server, prefix)
    scope = next(f"r{i}" for i in range(100) if shard_of_scope(f"r{i}") == 2)
    async with replicas(settings, "r1"), StateClient(settings=settings) as client:
        first = await client.call("state::update", increment(scope), call_id="retry-1")
        again = await client.call("state::update", increment(scope), call_id="retry-1")
        assert first == again and first["new_value"] == {"n": 1}
        assert (await client.get(scope, "n")) == {"n": 1}
    streams = shard_streams(prefix)
    # (the get went to the same shard: its scope's)
    assert [await added(raw, s) for s in streams] == [0, 0, 3]


async def test_two_replicas_share_every_shard(redis_server: RedisServer, raw: aredis.Redis,
                                              prefix: str) -> None:
    settings = sharded(redis_server, prefix)
    scopes = [f"t{i}" for i in range(12)]
    async with replicas(settings, "one", "two"), \
            StateClient(settings=settings) as client:
        for scope in scopes:
            await client.call("state::update", increment(scope))
        # Each replica is a consumer of each shard's group: it reads every shard.
        for stream in shard_streams(prefix):
            names = {c["name"] for c in await raw.xinfo_consumers(stream, "state")}
            assert names == {b"one", b"two"}, (stream, names)
    # The second replica alone answers calls of every shard.
    async with replicas(settings, "two"), StateClient(settings=settings) as client:
        for scope in scopes:
            assert (await client.call("state::update", increment(scope)))["new_value"] == {"n": 2}
    assert all([await added(raw, s) for s in shard_streams(prefix)])


async def test_a_trigger_handler_on_a_sharded_worker_gets_every_event(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    settings = sharded(redis_server, prefix)
    scopes = [f"ev{i}" for i in range(16)]
    async with replicas(settings, "r1"), StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {
            "id": "all", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"key_prefix": "k"}})
        for round_ in range(3):
            for scope in scopes:
                await client.set(scope, "k", round_)
        await until(lambda: len(handler.calls) >= 3 * len(scopes), 20, "every event")
        assert len(handler.calls) == 3 * len(scopes)
        for scope in scopes:  # every event once, in order per scope
            assert [b["new_value"] for _, b in handler.calls if b["scope"] == scope] == [0, 1, 2]
    want = Counter(shard_of_scope(s) for s in scopes for _ in range(3))
    got = [await added(raw, s) for s in shard_streams(prefix, "reactor")]
    assert got == [want[n] for n in range(SHARDS)] and all(got)


async def test_a_client_with_more_shards_than_the_service_is_told_at_once(
        redis_server: RedisServer, prefix: str) -> None:
    async with replicas(sharded(redis_server, prefix, 1), "r1"):
        async with StateClient(settings=sharded(redis_server, prefix)) as client:
            assert await client.missing_readers() == shard_streams(prefix)[1:]
            with pytest.raises(Unavailable) as caught:
                await check_readers(client, "state")
        assert "STATEWORKER_BUS_SHARDS" in str(caught.value)
        assert caught.value.details["streams"] == shard_streams(prefix)[1:]


async def test_status_shows_each_shard_in_one_line(redis_server: RedisServer,
                                                   prefix: str) -> None:
    settings = sharded(redis_server, prefix)
    async with replicas(settings, "r1"), StateClient(settings=settings) as client:
        for i in range(9):
            await client.set(f"st{i}", "k", i)
        report = await status_report(settings)
    state = report["services"]["state"]
    assert [s["shard"] for s in state["shards"]] == [0, 1, 2]
    assert [s["stream"] for s in state["shards"]] == shard_streams(prefix)
    assert all(s["pending"] == 0 and s["lag"] == 0 and s["read"] for s in state["shards"])
    assert [c["name"] for c in state["consumers"]] == ["r1"]
    lines = [line for line in summary(report).splitlines() if line.startswith("  state:")]
    assert lines == ["  state: 3 shards, pending 0/0/0, lag 0/0/0"]


# ---- kill -9 of a replica ------------------------------------------------------------------
# The replica after the kill: another one, which takes the dead one's pending entries of every
# shard over (XAUTOCLAIM, visibility timeout 500 ms), or the same one restarted, which reads
# its own pending entries of every shard first (its reclaim would run only after 5 minutes).
@pytest.mark.parametrize(("consumer", "visibility_ms"), [("crash-2", 500),
                                                         ("crash-1", 600_000)],
                         ids=["another-reclaims", "restarted-reads-its-pending"])
async def test_kill_9_of_a_replica_loses_no_call_of_any_shard(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, consumer: str,
        visibility_ms: int) -> None:
    streams, reply = shard_streams(prefix), f"{prefix}:reply:kill"
    scopes = [f"k{i}" for i in range(12)]
    ids = [f"call-{i}" for i in range(1500)]
    env = {"STATEWORKER_BUS_SHARDS": str(SHARDS)}
    first = ServiceProcess(redis_server.url, prefix, consumer="crash-1", env=env)
    first.start()
    try:
        async with raw.pipeline(transaction=False) as pipe:
            for n, call_id in enumerate(ids):
                scope = scopes[n % len(scopes)]
                pipe.xadd(streams[shard_of_scope(scope)], {
                    "id": call_id, "fn": "state::update", "reply": reply,
                    "body": msgspec.json.encode(increment(scope))})
            await pipe.execute()
        in_flight = await freeze_with_every_shard_pending(first, raw, streams, redis_server.port)
        first.kill()  # SIGKILL, with calls of every shard read and not answered
    finally:
        first.kill()
    second = ServiceProcess(redis_server.url, prefix, consumer=consumer,
                            visibility_timeout_ms=visibility_ms, env=env)
    second.start()
    try:
        await until(lambda: _at_least(raw, reply, len(ids)), 60, "every call answered")
        for stream in streams:
            await until(lambda s=stream: _drained(raw, s), 30, f"{stream} acknowledged")
    finally:
        second.kill()
    documents = [msgspec.json.decode(d) for d in await raw.lrange(reply, 0, -1)]
    assert sorted(d["id"] for d in documents) == sorted(ids)  # each once
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=PARTITIONS,
                               reaper=False) as store:
        for scope in scopes:  # each call applied once
            assert await store.get(scope, "n") == {"n": len(ids) // len(scopes)}
    print(f"in flight at the kill, by shard: {in_flight}")


async def freeze_with_every_shard_pending(service: ServiceProcess, raw: aredis.Redis,
                                          streams: list[str], port: int) -> list[int]:
    """SIGSTOP the service at a moment its group holds pending entries of every shard and
    Redis has run all it sent: what a kill leaves then. The pending count of each shard."""
    with anyio.fail_after(30):
        while True:
            service.freeze()
            while not tcp_quiet(port):
                await anyio.sleep(0.002)  # polling the kernel's socket queues
            counts = [(await raw.xpending(s, "state"))["pending"] for s in streams]
            if all(counts):
                return counts
            service.thaw()


async def _at_least(raw: aredis.Redis, reply: str, count: int) -> bool:
    return int(await raw.llen(reply)) >= count


async def _drained(raw: aredis.Redis, stream: str) -> bool:
    return (await raw.xpending(stream, "state"))["pending"] == 0 and await raw.xlen(stream) == 0
