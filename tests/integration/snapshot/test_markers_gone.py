"""A Redis whose meta hash is gone but whose entries are not looks new to a starting service,
which leaves the prefix undecided (`PENDING`) for the repair at start. Its entries are live
data, newer than the snapshot (its lag): never restored over. The meta hash lost alone (on a
Redis Cluster its node came back empty, the partitions' did not: their markers are
PostgreSQL's generation) is put back and the service serves; with the markers gone too, the
start is refused, and so is `stateworker restore`. And a process without the snapshot
(STATEWORKER_POSTGRES_URL unset) never begins anew a prefix a snapshotter found wiped, and
`stateworker restore` never rolls back a Redis that is whole."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import msgspec
import pytest

from stateworker.errors import ConfigError, RestoreRefused, StateError
from stateworker.settings import Settings
from stateworker.snapshot import restore
from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state import lifecycle
from stateworker.state.core.store import RedisState
from stateworker.state.kv.packed import unpack
from tests.integration.snapshot.driven import bus_call, opened, snapshot_of
from tests.integration.snapshot.test_restore import restore_command
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def lagging(own_redis: RedisServer, prefix: str, postgres_url: str
                  ) -> AsyncIterator[tuple[Settings, RedisState]]:
    """k=1 and `gone` in PostgreSQL; then k=2 and `gone` deleted, acknowledged, not there."""
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    async with opened(settings) as state:
        snapshotter = Snapshotter(state, postgres_url)
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 1}, "c1")
        await bus_call(state, "state::set", {"scope": "s", "key": "gone", "value": 1}, "c2")
        with anyio.fail_after(30):
            while len(snapshot_of(postgres_url, prefix)) < 2:
                await snapshotter._step()
        await snapshotter._close()
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 2}, "c3")
        await bus_call(state, "state::delete", {"scope": "s", "key": "gone"}, "c4")
        yield settings, state


async def assert_live(state: RedisState) -> None:
    """What was acknowledged last: k=2, `gone` deleted."""
    entry = state.keys.for_scope("s").entry
    held = unpack(await state.conn.execute("GET", entry("s", "k")))
    assert (held.value, held.version) == (b"2", 2)
    assert await state.conn.execute("GET", entry("s", "gone")) is None


async def test_a_meta_hash_lost_alone_is_put_back_at_start_and_the_entries_kept(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    async with lagging(own_redis, prefix, postgres_url) as (settings, state):
        meta = state.keys.meta
        before = own_redis.client().hgetall(meta)
    own_redis.client().delete(meta)
    async with opened(settings) as state:
        await assert_live(state)
        assert own_redis.client().hgetall(meta) == before
        written = await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 3}, "c5")
        assert written.version == 3


async def test_entries_without_any_marker_are_never_restored_over(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    async with lagging(own_redis, prefix, postgres_url) as (settings, state):
        keys = state.keys
    own_redis.client().delete(keys.meta, keys.registry_marker,
                              *(p.history for p in keys.all_partitions()))
    with pytest.raises(ConfigError, match="still holds entries"):
        async with opened(settings):
            pass
    state = await lifecycle.connect(settings)
    try:
        with pytest.raises(RestoreRefused, match="already holds entries"):
            await restore.restore(state, postgres_url)
        await assert_live(state)
    finally:
        await state.close()


async def test_a_process_without_the_snapshot_leaves_a_redis_found_wiped_refusing_writes(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A FLUSHALL, found by the snapshotter (writes refused: STORE_LOST); then an operator's
    command or a program opens the prefix from a shell without STATEWORKER_POSTGRES_URL. It
    must not begin the prefix anew: writes stay refused until `stateworker restore`."""
    async with lagging(own_redis, prefix, postgres_url) as (settings, state):
        own_redis.client().flushall()
        snapshotter = Snapshotter(state, postgres_url)
        await snapshotter._step()  # (a round: it finds the Redis lost)
        await snapshotter._close()
        with pytest.raises(StateError) as refused:
            await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 3}, "c5")
        assert refused.value.code == "STORE_LOST"
        blind = msgspec.structs.replace(settings, postgres_url=None)
        async with lifecycle.open_state(settings=blind, reaper=False) as other:
            with pytest.raises(StateError) as again:
                await bus_call(other, "state::set", {"scope": "s", "key": "k", "value": 3}, "c6")
            assert again.value.code == "STORE_LOST"
        with pytest.raises(StateError) as still:
            await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 3}, "c7")
        assert still.value.code == "STORE_LOST"


async def test_a_restore_of_a_redis_that_is_not_lost_is_refused(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """Every key deleted, the deletes not in PostgreSQL yet, the markers PostgreSQL's: the
    Redis is whole, and empty. `stateworker restore` would bring the deleted keys back (and
    skip the events not handed on): refused, and they stay deleted."""
    async with lagging(own_redis, prefix, postgres_url) as (_, state):
        await bus_call(state, "state::delete", {"scope": "s", "key": "k"}, "c5")
        done = await anyio.to_thread.run_sync(restore_command, own_redis.url, prefix,
                                              postgres_url)
        assert done.returncode == 1, done.stdout
        error = msgspec.json.decode(done.stderr.strip().splitlines()[-1])
        assert error["code"] == "RESTORE_REFUSED" and "whole" in error["message"]
        assert await state.conn.execute("GET", state.keys.for_scope("s").entry("s", "k")) is None
