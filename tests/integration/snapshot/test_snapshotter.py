"""The snapshot in a real PostgreSQL: it converges to Redis entry for entry, keeps the
trimming back while it lags, and applies a batch twice without changing anything."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import psycopg
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import ConfigError
from stateworker.settings import Settings
from stateworker.snapshot import generation as pg_generation
from stateworker.snapshot import schema, tables
from stateworker.snapshot.generation import Fenced
from stateworker.snapshot.snapshotter import connect
from tests.integration.busproto import until
from tests.integration.snapshots import (
    caught_up,
    mixed_writes,
    nothing_to_reap,
    postgres_entries,
    redis_entries,
)
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

WRITES = 20_000


@pytest.fixture
async def snapshotting(redis_server: RedisServer, prefix: str,
                       postgres_url: str) -> AsyncIterator[StateService]:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    async with StateService.running(settings, BusOptions(block_ms=50)) as running:
        yield running


async def converged(redis_server: RedisServer, store: StateStore, url: str,
                    timeout: float) -> None:
    client = redis_server.client()
    keys = store.state.keys
    await until(lambda: caught_up(client, keys) and nothing_to_reap(client, keys, now_ms()),
                timeout, "the snapshot to catch up")
    assert postgres_entries(url, keys.prefix) == redis_entries(client, keys)


async def test_postgres_equals_redis_after_mixed_writes(
        snapshotting: StateService, store: StateStore, redis_server: RedisServer,
        postgres_url: str) -> None:
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for worker in range(8):
            tg.start_soon(mixed_writes, store, WRITES // 8, worker)
    entries = redis_entries(redis_server.client(), store.state.keys)
    assert len(entries) > 200, "the writes should leave a good number of live entries"
    await converged(redis_server, store, postgres_url, 120)
    assert any(e[3] for e in entries.values()) and any(e[4] for e in entries.values())
    assert time.monotonic() - started < 240


async def test_an_older_batch_applied_again_changes_nothing(postgres_url: str) -> None:
    pg = await connect(postgres_url)
    try:
        await pg_generation.adopt(pg, "p", "g1", 4)
        newer = tables.Row("s", "k", '{"a":2}', 2, "h2", "t", 1, 2, None, "w", (20, 0))
        older = tables.Row("s", "k", '{"a":1}', 1, "h1", None, 1, 1, None, "w", (10, 0))
        kept = {("s", "k"): ('{"a":2}', 2, "h2", "t", None)}
        await tables.apply(pg, "p", 0, [newer], [], tables.StoredPosition("20-0", 2),
                           generation="g1", reads=1)
        # An older batch again (a replica that lost its lease, a crash before the mirror):
        # neither its write nor its delete touches the newer row, nor does the position go back.
        # (Each read of Redis takes a new count, above the last committed.)
        await tables.apply(pg, "p", 0, [older], [], tables.StoredPosition("10-0", 1),
                           generation="g1", reads=2)
        assert postgres_entries(postgres_url, "p") == kept
        await tables.apply(pg, "p", 0, [], [tables.Gone("s", "k", (10, 0))],
                           tables.StoredPosition("10-0", 1),
                           generation="g1", reads=3)
        assert postgres_entries(postgres_url, "p") == kept
        assert await tables.positions(pg, "p") == {0: tables.StoredPosition("20-0", 2)}
        await tables.apply(pg, "p", 0, [newer], [], tables.StoredPosition("20-0", 2),
                           generation="g1", reads=4)
        assert postgres_entries(postgres_url, "p") == kept
        assert await tables.positions(pg, "p") == {0: tables.StoredPosition("20-0", 2)}
        # A read counted before the last one committed (its batch committed late, or read
        # from an older copy of Redis at a count PostgreSQL is past) is refused whole.
        with pytest.raises(Fenced, match="snapshot read count 3 is not above"):
            await tables.apply(pg, "p", 0, [], [tables.Gone("s", "k", (30, 0))],
                               tables.StoredPosition("30-0", 3), generation="g1", reads=3)
        assert postgres_entries(postgres_url, "p") == kept
        assert await tables.positions(pg, "p") == {0: tables.StoredPosition("20-0", 2)}
        # The delete that followed the newer write removes it.
        await tables.apply(pg, "p", 0, [], [tables.Gone("s", "k", (30, 0))],
                           tables.StoredPosition("30-0", 3), generation="g1", reads=5)
        assert postgres_entries(postgres_url, "p") == {}
    finally:
        await pg.close()


async def test_a_schema_newer_than_the_code_is_refused(postgres_url: str) -> None:
    await (await connect(postgres_url)).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sw_schema_migrations (version, name) VALUES (%s, 'future')",
                     (schema.known_version() + 1,))
    with pytest.raises(ConfigError, match=r"schema is at version \d+, newer than this "):
        await connect(postgres_url)


async def test_migrations_apply_once(postgres_url: str) -> None:
    async def start_one() -> None:
        await (await connect(postgres_url)).close()

    async with anyio.create_task_group() as tg:  # four replicas starting at once
        for _ in range(4):
            tg.start_soon(start_one)
    with psycopg.connect(postgres_url) as conn:
        versions = [r[0] for r in conn.execute(
            "SELECT version FROM sw_schema_migrations ORDER BY version").fetchall()]
    assert versions == list(range(1, schema.known_version() + 1))


async def test_without_postgres_the_service_says_once_it_runs_on_redis_alone(
        redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    with caplog.at_level("WARNING", logger="stateworker.snapshot"):
        async with StateService.running(settings, BusOptions(block_ms=50)) as running:
            assert running.snapshotter is None
    said = [r.getMessage() for r in caplog.records if "running on Redis alone" in r.getMessage()]
    assert said == ["no STATEWORKER_POSTGRES_URL: running on Redis alone (no snapshot in "
                    "PostgreSQL)"]


async def test_a_snapshot_started_late_rescans_what_the_streams_no_longer_hold(
        redis_server: RedisServer, prefix: str, store: StateStore, postgres_url: str) -> None:
    await mixed_writes(store, 1500, seed=3)
    client = redis_server.client()
    for part in store.state.keys.all_partitions():  # the events are long trimmed away
        client.xtrim(part.events, maxlen=0)
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    async with StateService.running(settings, BusOptions(block_ms=50)):
        await mixed_writes(store, 500, seed=4)
        await converged(redis_server, store, postgres_url, 60)
    # While no snapshot runs, changes whose events are then cut (the hard cap): the rescan
    # finds them, deletes included.
    for scope, key in list(redis_entries(client, store.state.keys))[:100]:
        await store.delete(scope, key)
    await mixed_writes(store, 300, seed=5)
    for part in store.state.keys.all_partitions():
        client.xtrim(part.events, maxlen=0)
    async with StateService.running(settings, BusOptions(block_ms=50)):
        await converged(redis_server, store, postgres_url, 60)
