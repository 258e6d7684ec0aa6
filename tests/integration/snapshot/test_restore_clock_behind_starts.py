"""A restore onto a Redis whose clock reads earlier than the Redis of before: the revisions
handed out before that are no entry's (a delete's, an expiry's, a trigger's start) stay
behind the new stream ids, as the entries' revisions do
(test_restore_clock_behind.py).

The Redis of before is made to have run ahead with `XSETID` (what `XADD *` does after a clock
step back). Found by attack: the restore set each stream past its newest *row* only, so
- a trigger registered after the clock ran ahead (its start the stream's last id) was not
  called for the writes after the restore, whose ids were below its start, until this
  Redis's clock passed it: those calls never came;
- a watch resumed from a bookmark at a delete (no row holds its revision) was refused
  COMPACTED (a cursor ahead of this Redis), and once the clock passed the bookmark it
  resumed without a word and skipped every write made after the restore before then."""

from __future__ import annotations

import itertools

import anyio
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.events.model import Event
from stateworker.events.watch import Watch
from stateworker.keys import KeySpace
from tests.integration.busproto import until
from tests.integration.snapshot.test_expiry_across_a_restore import triggers_copied
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import all_dispatched, caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

AHEAD_MS = 600_000  # how far the clock of the Redis of before ran ahead


async def test_triggers_and_watches_of_before_see_the_writes_after_a_restore_onto_a_clock_behind(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    # "t" holds the trigger, "w" the watch: two partitions, so each is seen alone.
    watched = next(f"w{i}" for i in itertools.count()
                   if keys.partition_of(f"w{i}") != keys.partition_of("t"))
    reactor = f"{prefix}:bus:reactor"

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        await store.set("t", "k", "v1")
        await store.set(watched, "k", "v1")
        # (followed from here: a partition's first position is its stream's end)
        await until(lambda: caught_up(client, keys), 30, "the snapshot to follow")
        for scope in ("t", watched):  # (no event since: the trigger's start is no event's)
            client.execute_command("XSETID", keys.for_scope(scope).events,
                                   f"{now_ms() + AHEAD_MS}-0")
        await store.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": "t"}})
        await store.delete(watched, "k")
        bookmark = (await store.events(watched))[-1].revision  # (the delete's: no row's)
        await until(lambda: caught_up(client, keys) and all_dispatched(client, keys)
                    and triggers_copied(postgres_url, prefix), 30, "the snapshot")
        client.delete(reactor)  # (the trigger saw nothing yet: nothing after its start)

    client.flushall()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        assert await store.get("t", "k") == "v1"  # (the repair at start restored it)
        await store.set("t", "k", "v2")
        await store.set(watched, "k", "again")
        await until(lambda: all_dispatched(client, keys), 30, "the events dispatched")
        await until(lambda: client.exists(reactor) and client.xlen(reactor) == 1, 30,
                    "the trigger called for the write after the restore")
        with anyio.fail_after(10):
            async with Watch(own_redis.url, settings, scope=watched,
                             from_revision=bookmark) as watch:
                first = await anext(watch)
        assert isinstance(first, Event)
        assert (first.key, first.type, bytes(first.new_value)) == ("k", "state:created",
                                                                   b'"again"')
