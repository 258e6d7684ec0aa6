"""A Redis that loses its data never overwrites the truth in PostgreSQL (issue 38), tried from
the attacker's side with the service running: a FLUSHALL, a Redis restarted on an empty data
directory, a Redis started on an older copy of its data. Each time every write is refused with
STORE_LOST (counted: every one of them), `status`, `/readyz` and the metric say so, PostgreSQL
keeps every row and version it had through several snapshot rounds, and `stateworker restore`,
run while the service runs, brings every entry, trigger, claim, principal and barrier back, after
which writes go on from the versions PostgreSQL held. Without a snapshot the prefix begins anew
by itself."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg
import pytest
import redis

from stateworker import StateError, StateStore
from stateworker.app.cli import status_report
from stateworker.app.console import Tails
from stateworker.app.http import redis_unready
from stateworker.app.http_admission import Admission
from stateworker.app.metrics import Metrics
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state import generation, lifecycle
from stateworker.state.tenancy import principals
from tests.integration.busproto import until
from tests.integration.snapshot.test_repair import PARTITIONS, TRIGGER, seed, settings_for
from tests.integration.snapshot.test_restore import dump
from tests.integration.snapshots import all_dispatched, caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def postgres_truth(url: str, prefix: str) -> dict[str, Any]:
    """What PostgreSQL holds of the prefix, table by table (positions included)."""
    queries = {
        "entries": "SELECT scope, key, value_text, version, revision_ms, revision_seq "
                   "FROM sw_entries WHERE prefix = %s ORDER BY scope, key",
        "triggers": "SELECT id, registration FROM sw_triggers WHERE prefix = %s ORDER BY id",
        "claims": "SELECT scope, namespace FROM sw_claims WHERE prefix = %s ORDER BY scope",
        "principals": "SELECT name, record FROM sw_principals WHERE prefix = %s ORDER BY name",
        "roles": "SELECT name, record FROM sw_roles WHERE prefix = %s ORDER BY name",
        "barriers": "SELECT id, w FROM sw_barriers WHERE prefix = %s ORDER BY id",
        "positions": "SELECT partition, last_id, n FROM sw_positions WHERE prefix = %s "
                     "ORDER BY partition",
        "generation": "SELECT generation FROM sw_generations WHERE prefix = %s"}
    with psycopg.connect(url) as conn:
        return {name: conn.execute(sql, (prefix,)).fetchall() for name, sql in queries.items()}


async def restore_while_serving(redis_url: str, prefix: str, postgres_url: str
                                ) -> tuple[int, dict[str, Any], str]:
    """`stateworker restore` in its own process (the service goes on in this one)."""
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": str(PARTITIONS),
           "STATEWORKER_POSTGRES_URL": postgres_url}
    done = await anyio.run_process([sys.executable, "-m", "stateworker", "--redis-url",
                                    redis_url, "restore"], env=env, check=False)
    out = done.stdout.decode()
    return done.returncode, msgspec.json.decode(out) if out.strip() else {}, \
        done.stderr.decode()


async def refused_writes(store: StateStore) -> list[str]:
    """One write of each kind, each expected refused: the codes they got."""
    attempts = [
        store.set("s2", "twice", "after-wipe"),
        store.call("state::update", {"scope": "s1", "key": "n", "ops": [
            {"type": "increment", "path": "n", "by": 1}]}),
        store.delete("s2", "twice"),
        store.call("state::register-trigger", {**TRIGGER, "id": "t2"}),
        store.claim_namespace("other", ["taken"], caller="other"),
        store.barrier({"key": "b"}, {"id": "half", "expect": ["a", "b", "c"]}),
    ]
    codes = []
    for attempt in attempts:
        try:
            await attempt
            codes.append("OK")
        except StateError as exc:
            codes.append(exc.code)
    return codes


async def lost_seen_twice(client: redis.Redis, keys: KeySpace) -> None:
    """Two more snapshot rounds ran on the lost Redis (each writes when it saw it lost)."""
    seen: set[bytes] = set()

    def another() -> bool:
        at = client.hget(keys.snapshot_status, generation.SEEN_FIELD)
        if at is not None:
            seen.add(at)
        return len(seen) >= 3
    await until(another, 30, "two snapshot rounds on the lost Redis")


async def seeded_with_principal(client: redis.Redis, settings: Settings) -> tuple[Any, Any]:
    _, barriers = await seed(client, settings)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            lifecycle.open_state(settings=settings, reaper=False) as state:
        await principals.add_role(state, "orders", ["read", "write"], ["orders/*"], False, [])
        await principals.add_principal(state, "alice", ["orders"], [])
        await until(lambda: len(postgres_truth(settings.postgres_url or "", settings.prefix)[
            "principals"]) == 1, 30, "the principal in PostgreSQL")
    return dump(client, settings.prefix), barriers


async def wiped_then_restored(own_redis: RedisServer, prefix: str, postgres_url: str,
                              wipe: Any) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    before, _ = await seeded_with_principal(client, settings)
    truth = postgres_truth(postgres_url, prefix)
    assert len(truth["entries"]) > 100 and truth["triggers"] and truth["claims"]
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store:
        await wipe()
        await until(lambda: service.state.lost is not None, 30, "the service to see it lost")
        assert "generation marker" in (await redis_unready(service.state) or "")
        metrics = Metrics(service.state, service.runtime, Tails(settings), Admission(1, 1, 1))
        assert b"\nstateworker_store_lost 1.0\n" in (await metrics.exposition())[0]
        # Every write is refused, whatever its kind and door, and none of them lands anywhere.
        assert await refused_writes(store) == ["STORE_LOST"] * 6
        async with StateClient(settings=settings, timeout=10) as bus:
            with pytest.raises(StateError) as over_bus:
                await bus.call("state::set", {"scope": "s2", "key": "twice", "value": 0},
                               call_id="after-the-wipe")
            assert over_bus.value.code == "STORE_LOST"
            assert "stateworker restore" in over_bus.value.message
        await lost_seen_twice(client, keys)
        assert postgres_truth(postgres_url, prefix) == truth
        report = await status_report(settings)
        assert report["store_lost"] and "generation marker" in report["store_lost"]

        # A writer that keeps writing all along: refused until the restore's end, after
        # which what it writes stays (the restore is not refused for it).
        acked: dict[str, int] = {}
        refused: list[str] = []
        stop = anyio.Event()

        async def keep_writing() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    await store.set("busy", f"k{n}", n)
                    acked[f"k{n}"] = n
                except StateError as exc:
                    refused.append(exc.code)
                await anyio.sleep(0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_writing)
            code, summary, stderr = await restore_while_serving(own_redis.url, prefix,
                                                                postgres_url)
            stop.set()
        assert code == 0, stderr
        assert refused and set(refused) == {"STORE_LOST"}
        for key, n in acked.items():
            assert await store.get("busy", key) == n
        assert (summary["triggers"], summary["claims"], summary["principals"],
                summary["roles"], summary["barriers"]) == (1, 1, 1, 1, 3)
        assert summary["entries"] == len(truth["entries"])
        await until(lambda: service.state.lost is None, 30, "the service to see it recovered")
        assert await redis_unready(service.state) is None
        assert b"\nstateworker_store_lost 0.0\n" in (await metrics.exposition())[0]
        assert (await status_report(settings))["store_lost"] is None
        restored = dump(client, prefix)
        assert {k: v for k, v in restored.items() if b":e:" in k and b":e:4:busy" not in k} \
            == {k: v for k, v in before.items() if b":e:" in k}
        # Writes go on from the versions PostgreSQL held, and reach it.
        written = await store.set("s2", "twice", "z")
        assert written.version == 3
        async with StateClient(settings=settings, timeout=10) as bus:  # (it was not recorded)
            again = await bus.call("state::set", {"scope": "s2", "key": "twice", "value": 0},
                                   call_id="after-the-wipe")
            assert again["version"] == 4
        await until(lambda: ("s2", "twice", '0', 4) in [
            row[:4] for row in postgres_truth(postgres_url, prefix)["entries"]], 30,
            "the write after the restore in PostgreSQL")
        with pytest.raises(StateError) as claimed:
            await store.get("private", "k")
        assert claimed.value.code == "RESERVED_SCOPE"
        # The trigger delivers a new write, and only it (no restored entry fired).
        reactor = f"{prefix}:bus:reactor"
        await store.set("s1", "after-restore", 1)
        await until(lambda: client.exists(reactor) and all_dispatched(client, keys), 30,
                    "the new write dispatched")
        calls = client.xrange(reactor)
        assert len(calls) == 1 and b"after-restore" in calls[0][1][b"body"]
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            assert list((await principals.stored(state))[0]) == ["alice"]


async def test_a_flushall_while_serving_keeps_postgres_and_a_restore_brings_all_back(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    async def flushall() -> None:
        own_redis.client().flushall()
    await wiped_then_restored(own_redis, prefix, postgres_url, flushall)


async def test_a_redis_restarted_on_an_empty_data_directory_is_the_same(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    async def empty_restart() -> None:
        own_redis.kill()
        for child in Path(own_redis.directory).iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        own_redis.start()
    await wiped_then_restored(own_redis, prefix, postgres_url, empty_restart)


async def test_without_a_snapshot_a_wiped_prefix_begins_anew_by_itself(
        own_redis: RedisServer, prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert (await store.set("s", "k", 1)).version == 1
        assert (await store.set("s", "k", 2)).version == 2
        own_redis.client().flushall()

        async def writes() -> bool:
            try:
                return (await store.set("s", "k", 3)).version == 1
            except StateError as exc:
                assert exc.code == "STORE_LOST"
                return False
        await until(writes, 30, "the prefix to begin anew")
        assert store.state.lost is None


def swap_data(server: RedisServer, directory: Path) -> None:
    """Stop Redis cleanly and start it again on the data in `directory` (a copy of before)."""
    server.kill(signal.SIGTERM)  # (a clean shutdown: the AOF is complete)
    shutil.rmtree(server.directory)
    shutil.copytree(directory, server.directory)
    server.start()


async def test_a_redis_started_on_an_older_copy_of_its_data_is_found_behind(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """Same generation, fewer events: the partitions behind PostgreSQL refuse writes, the
    others go on; nothing older reaches PostgreSQL (no row, version or registry goes back)."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    behind = keys.partition_of("later")
    other = next(s for s in (f"s{n}" for n in range(100)) if keys.partition_of(s) != behind)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.set("later", "k", "old")
        await store.set(other, "k", "kept")
        await store.call("state::register-trigger", TRIGGER)
        await until(lambda: caught_up(client, keys) and postgres_truth(
            postgres_url, prefix)["triggers"], 30, "the snapshot to hold the writes")
    older = tmp_path / "older"
    own_redis.kill(signal.SIGTERM)  # (a clean shutdown: the AOF complete, then a copy of it)
    shutil.copytree(own_redis.directory, older)
    own_redis.start()
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store:
        for n in range(5):
            await store.set("later", "k", f"new-{n}")  # version 6 in PostgreSQL
        await store.call("state::unregister-trigger", {"id": TRIGGER["id"]})
        await until(lambda: caught_up(client, keys) and not postgres_truth(
            postgres_url, prefix)["triggers"], 30, "the snapshot to hold the newer writes")
        truth = postgres_truth(postgres_url, prefix)
        swap_data(own_redis, older)
        await until(lambda: service.state.lost is not None, 30, "the service to see it behind")
        await lost_seen_twice(client, keys)
        assert postgres_truth(postgres_url, prefix) == truth
        report = (await status_report(settings))["store_lost"]
        assert f"partition {behind}'s event stream" in report and "behind" in report
        with pytest.raises(StateError) as refused:
            await store.set("later", "k", "lost")
        assert refused.value.code == "STORE_LOST"
        assert (await store.set(other, "k2", "fine")).version == 1  # a partition not behind
        # The recovery: the prefix's keys gone, then the restore (the service running).
        client.flushall()
        code, summary, stderr = await restore_while_serving(own_redis.url, prefix, postgres_url)
        assert code == 0, stderr
        await until(lambda: service.state.lost is None, 30, "the service to see it recovered")
        assert await store.get("later", "k") == "new-4"
        assert summary["triggers"] == 0
        assert (await store.set("later", "k", "after")).version == 7


async def test_an_older_copy_that_took_new_writes_since_is_behind_too(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """Its streams have had as many events added as PostgreSQL applied by now, but not the
    same ones: the service refuses to start on it, and PostgreSQL keeps every version."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.set("later", "k", "old")
        await until(lambda: caught_up(client, keys), 30, "the snapshot to hold the write")
    older = tmp_path / "older"
    own_redis.kill(signal.SIGTERM)
    shutil.copytree(own_redis.directory, older)
    own_redis.start()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        for n in range(3):
            await store.set("later", "k", f"new-{n}")  # version 4 in PostgreSQL
        await until(lambda: caught_up(client, keys), 30, "the snapshot to hold the writes")
    truth = postgres_truth(postgres_url, prefix)
    swap_data(own_redis, older)
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        for n in range(6):  # (the older copy's stream catches up on the count, other events)
            await store.set("later", "k", f"other-{n}")
    with pytest.raises(ConfigError) as refused:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            pass
    assert "holds no event" in str(refused.value) and "does not merge" in str(refused.value)
    assert postgres_truth(postgres_url, prefix) == truth


async def test_a_redis_that_may_evict_a_key_is_refused_at_start(
        own_redis: RedisServer, prefix: str) -> None:
    """Eviction would drop entries (and markers) one by one, without a wipe to notice."""
    own_redis.client().config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(ConfigError) as refused:
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS):
            pass
    assert "maxmemory-policy allkeys-lru" in str(refused.value)
    assert "noeviction" in str(refused.value)
    # With a memory limit, a volatile policy evicts what has an expiry: the call records
    # (a retried call id applied again), completed barriers, leases.
    own_redis.client().config_set("maxmemory-policy", "volatile-lru")
    own_redis.client().config_set("maxmemory", 512 * 1024 * 1024)
    with pytest.raises(ConfigError) as volatile:
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS):
            pass
    assert "maxmemory-policy volatile-lru" in str(volatile.value)
    assert "applied twice" in str(volatile.value) and "noeviction" in str(volatile.value)
    own_redis.client().config_set("maxmemory", 0)  # (no limit: nothing is ever evicted)
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert (await store.set("s", "k", 1)).version == 1


async def test_two_restores_at_once_one_is_refused(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client = own_redis.client()
    await seed(client, settings)
    client.flushall()
    results: list[tuple[int, dict[str, Any], str]] = []

    async def one() -> None:
        results.append(await restore_while_serving(own_redis.url, prefix, postgres_url))
    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    assert sorted(code for code, _, _ in results) == [0, 1]
    _, _, stderr = next(r for r in results if r[0] == 1)
    assert msgspec.json.decode(stderr.strip().splitlines()[-1])["code"] == "RESTORE_REFUSED"


async def test_a_wipe_during_a_restore_stamps_nothing(own_redis: RedisServer,
                                                      prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        restoring = generation.new_generation()
        await generation.begin_restore(store.state.conn, store.state.keys, restoring)
        own_redis.client().flushall()  # (what the restore wrote so far, gone)
        with pytest.raises(StateError) as failed:
            await generation.stamp(store.state, restoring)
        assert failed.value.code == "UNAVAILABLE" and "run `stateworker restore` again" in \
            failed.value.message
        markers = await generation.read(store.state.conn, store.state.keys)
        assert markers.partitions == (None,) * PARTITIONS and markers.registry is None


async def test_a_meta_hash_lost_alone_is_put_back_whole(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """Its node lost it, the partitions' did not (a cluster): the data is intact, so the
    snapshot puts its layout facts back (partitions, packed entries, the generation), writes
    go on, and a new process opens the prefix."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.set("s", "k", 1)
        await until(lambda: caught_up(client, keys), 30, "the snapshot")
        before = client.hgetall(keys.meta)
        client.delete(keys.meta)
        await until(lambda: client.hgetall(keys.meta) == before, 30, "the meta hash back")
        assert (await store.set("s", "k", 2)).version == 2
    async with StateStore.open(settings=settings) as again:
        assert await again.get("s", "k") == 2
