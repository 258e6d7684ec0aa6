"""A restore and a snapshot commit in flight (decision 0036: a call's record is never restored
without its change). A snapshotter read a write and its call's record in Redis, and its commit
waits in PostgreSQL; Redis is wiped and a restore begins. The restore makes PostgreSQL follow
its generation before it reads anything there, so the commit lands first (or not at all) and
the restore reads its row together with its record: a retry of the call finds its change."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest

from stateworker.settings import Settings
from stateworker.snapshot import calls
from stateworker.snapshot import restore as restoring
from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state.core.store import RedisState
from stateworker.state.kv.packed import unpack
from tests.integration.busproto import until
from tests.integration.snapshot.driven import bus_call, opened, snapshot_of
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def waiting_on_locks(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE wait_event_type = 'Lock'").fetchone()
    return int(row[0]) if row else 0


async def test_a_restore_reads_a_commit_in_flight_whole_or_not_at_all(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    async with opened(settings) as state:
        snapshotter = Snapshotter(state, postgres_url)
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 1}, "c1")
        with anyio.fail_after(30):
            while snapshot_of(postgres_url, prefix).get(("s", "k")) != ("1", 1):
                await snapshotter._step()
        assert (await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 2},
                               "c2")).version == 2
        # c2's commit is held up in PostgreSQL (its row locked by another session), after
        # its fence; it is let go once the restore waits too (the restore's wait for it), or
        # else when the restore reads the call records (where a commit let in after the
        # entries were read would show: c2's record without its change).
        blocker = await psycopg.AsyncConnection.connect(postgres_url)
        await blocker.execute("SELECT 1 FROM sw_entries WHERE prefix = %s AND key = 'k' "
                              "FOR UPDATE", (prefix,))
        committed, released = anyio.Event(), anyio.Event()

        async def release() -> None:
            if not released.is_set():
                released.set()
                await blocker.commit()

        async def commit_c2() -> None:
            await snapshotter._step()  # reads k=2 and c2's record from Redis, then commits
            committed.set()

        async def let_go_once_the_restore_waits() -> None:
            await until(lambda: waiting_on_locks(postgres_url) >= 2, 30, "two waits")
            await release()

        restore_calls = calls.restore

        async def calls_read_late(state: RedisState, pg: Any) -> int:
            await release()
            await committed.wait()
            return await restore_calls(state, pg)

        monkeypatch.setattr(calls, "restore", calls_read_late)
        async with anyio.create_task_group() as tg:
            tg.start_soon(commit_c2)
            await until(lambda: waiting_on_locks(postgres_url) >= 1, 30, "the commit's wait")
            own_redis.client().flushall()  # wiped while the commit waits
            tg.start_soon(let_go_once_the_restore_waits)
            await restoring.restore(state, postgres_url)
            tg.cancel_scope.cancel()
        await blocker.close()
        await snapshotter._close()
        await until(lambda: state.lost is None, 30, "writes let in again")
        assert snapshot_of(postgres_url, prefix)[("s", "k")] == ("2", 2)
        # A retry of c2 finds its change, whether answered from its record or applied again.
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 2}, "c2")
        held = unpack(await state.conn.execute("GET", state.keys.for_scope("s").entry("s", "k")))
        assert (held.value, held.version) == (b"2", 2)
