"""A restore onto a Redis whose clock reads earlier than the Redis of before (another host,
or the same one after its clock was set back): every write acknowledged after the restore
reaches PostgreSQL, and a second wipe and restore brings it back.

An entry's revision is its last event's stream id, which Redis gives from its own clock
(`XADD *`); the snapshot moves a row only to a newer revision and deletes it only up to the
revision of the delete. The Redis of before is made to have run ahead with `XSETID` on its
event stream (what `XADD *` does after a clock step back: every id past the last one given),
so the rows PostgreSQL holds carry revisions ten minutes ahead of the restored Redis's clock.
Found by attack: the restore began new streams at that clock, the writes after it got lower
revisions than the rows, PostgreSQL kept version 1 of an entry Redis held at version 2 and a
key deleted since, and the next restore brought the old value and the deleted key back."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.keys import KeySpace
from tests.integration.busproto import until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import caught_up, postgres_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

AHEAD_MS = 600_000  # how far the clock of the Redis of before ran ahead


async def test_writes_after_a_restore_onto_a_clock_behind_reach_postgres(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    events = keys.for_scope("s").events

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        await store.set("s", "kept", "first")  # (the stream exists from here)
        client.execute_command("XSETID", events, f"{now_ms() + AHEAD_MS}-0")
        await store.set("s", "kept", "v1")
        await store.set("s", "dropped", "v1")
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")
    assert postgres_entries(postgres_url, prefix)[("s", "kept")][:2] == ('"v1"', 2)

    client.flushall()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert await store.get("s", "kept") == "v1"  # (the repair at start restored it)
        await store.set("s", "kept", "v2")  # acknowledged, version 3
        assert await store.delete("s", "dropped") == "v1"
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")
    held = postgres_entries(postgres_url, prefix)
    assert held[("s", "kept")][:2] == ('"v2"', 3)
    assert ("s", "dropped") not in held

    client.flushall()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert await store.get("s", "kept") == "v2"
        assert await store.get("s", "dropped") is None
