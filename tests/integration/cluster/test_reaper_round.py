"""The background TTL reaper's round (state/expiry.py: every partition's first batch, the old
writes forgotten and the expired triggers, in one pipeline) on one server and on the 3+3
cluster, whose partitions sit on every primary: every expired entry gets its state:deleted
event, past the first batch, and a leased trigger whose lease ran out is removed."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from tests.integration.busproto import until
from tests.lua.ttl import expiring, pass_time

from .conftest import SPREAD_PARTITIONS

pytestmark = pytest.mark.anyio

KEYS = [f"k{i:02d}" for i in range(12)]  # more than one batch (reaper_batch=5)


async def deleted_keys(store: StateStore, scope: str) -> list[str]:
    return sorted(e.key for e in await store.events(scope) if e.type == "state:deleted")


async def test_the_background_reaper_deletes_in_every_partition(
        url: str, spread_prefix: str, spread_scopes: list[str]) -> None:
    async with StateStore.open(url, prefix=spread_prefix, partitions=SPREAD_PARTITIONS,
                               reaper_batch=5, reaper_interval_s=0.05) as store:
        await store.call("state::register-trigger", {
            "id": "leased", "function_id": "reactor::on", "service": "reactor", "ttl_ms": 500})
        until_ms = max([await expiring(store, s, KEYS, ttl_ms=300) for s in spread_scopes])
        await pass_time(until_ms)

        async def all_deleted() -> bool:
            return all([await deleted_keys(store, s) == KEYS for s in spread_scopes])

        await until(all_deleted, 20, "every expired entry's state:deleted event")
        await until(lambda: _no_triggers(store), 20, "the leased trigger removed")
        assert await store.list_groups() == []


async def _no_triggers(store: StateStore) -> bool:
    return int(await store.state.conn.execute("HLEN", store.state.keys.triggers)) == 0
