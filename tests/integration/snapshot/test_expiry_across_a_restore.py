"""An entry's expiry across a wipe and a restore. A key whose expiry passed while Redis was
wiped (before the restore began) or passes while the restore runs (a restore of a large
prefix takes minutes) expired all the same: after the restore it reads as gone, its
`state:deleted` event is written (a trigger on the scope is called for it, as it would have
been had Redis lived), and its PostgreSQL row goes. Before: the restore left a row already
expired out (`skipped_expired`) and a running service's reaper deleted one that expired
mid-restore before the restore moved every position to its stream's end: either way no event
was ever written and the row stayed in `sw_entries` for good (no event ever deletes it; a
later restore skips it again)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import StoreLost
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.snapshot import calls
from stateworker.snapshot import restore as restoring
from stateworker.state import lifecycle
from stateworker.state.core.store import RedisState
from stateworker.state.expiry import reap_expired
from tests.integration.busproto import until
from tests.integration.snapshots import all_dispatched, caught_up, postgres_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4


def triggers_copied(url: str, prefix: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM sw_triggers WHERE prefix = %s",
                           (prefix,)).fetchone()
    return row is not None and row[0] == 1


def deleted_calls(client: Any, reactor: str) -> list[bytes]:
    """The keys whose deletion the trigger was called for."""
    found = []
    for _, fields in client.xrange(reactor):
        body = fields[b"body"]
        if b'"state:deleted"' in body:
            found.append(body.split(b'"key":"', 1)[1].split(b'"', 1)[0])
    return sorted(found)


async def test_an_expiry_passed_before_or_during_a_restore_is_written_and_leaves_postgres(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    reactor = f"{prefix}:bus:reactor"
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": "leases"}})
        await store.set("leases", "gone", 1, ttl_ms=1500)
        gone_by = now_ms() + 1500  # (at or after its expiry)
        await store.set("leases", "during", 2, ttl_ms=5000)
        during_by = now_ms() + 5000
        await store.set("leases", "kept", 3)
        await until(lambda: caught_up(client, keys) and all_dispatched(client, keys)
                    and len(postgres_entries(postgres_url, prefix)) == 3
                    and triggers_copied(postgres_url, prefix), 30, "the snapshot")
        client.flushall()  # (the trigger's calls of the three sets with it)
        await until(lambda: now_ms() > gone_by, 10, "gone's expiry, Redis wiped")

        # `stateworker restore` while the service runs; its reaper's round comes once the
        # entries are written, after "during" expired too.
        restore_calls = calls.restore
        refused: list[str] = []

        async def reaper_round_first(state: RedisState, pg: Any) -> int:
            await until(lambda: now_ms() > during_by, 10, "during's expiry, mid-restore")
            try:
                await reap_expired(state)
            except StoreLost as exc:  # (writes are refused until the restore's last step)
                refused.append(exc.code)
            return await restore_calls(state, pg)

        monkeypatch.setattr(calls, "restore", reaper_round_first)
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            summary = await restoring.restore(state, postgres_url)
        await until(lambda: store.state.lost is None, 30, "writes let in again")

        assert await store.get("leases", "gone") is None
        assert await store.get("leases", "during") is None
        assert await store.get("leases", "kept") == 3
        # Both expiries happened: their events are written, the trigger is called for each,
        # and PostgreSQL follows (the rows go); the kept key fires nothing.
        await until(lambda: deleted_calls(client, reactor) == [b"during", b"gone"], 30,
                    "the trigger called for both expiries")
        expired = [e for e in await store.events("leases") if e.type == "state:deleted"]
        assert sorted(e.key for e in expired) == ["during", "gone"]
        await until(lambda: caught_up(client, keys)
                    and set(postgres_entries(postgres_url, prefix)) == {("leases", "kept")},
                    30, "PostgreSQL without the expired rows")
        assert len(client.xrange(reactor)) == 2
        # (the reaper's round mid-restore deleted nothing: writes were refused)
        assert refused == ["STORE_LOST"]
        assert summary.entries == 3 and summary.expired >= 1  # (gone; during too on a slow start)
