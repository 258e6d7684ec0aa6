"""A watch resumed across a wiped Redis: the event streams begin anew (a restore writes no
event), so a revision from before cannot be resumed from: COMPACTED, naming the oldest revision
kept, whether the Redis was restored from PostgreSQL (the repair at start) or started anew
without it. A revision from after the new start resumes with every later event; one ahead of
this Redis's clock and events is not of its history."""

from __future__ import annotations

import anyio
import pytest

from stateworker import StateClient, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import Compacted
from stateworker.events.model import Bookmark, Event
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4


def watcher(url: str, prefix: str) -> StateClient:
    return StateClient(settings=Settings(redis_url=url, prefix=prefix, partitions=PARTITIONS,
                                         watch_progress_s=0.2), timeout=5)


async def until_quiet(url: str, prefix: str, scope: str | None, start: str) -> list[Event]:
    """The events of a watch from `start` until its first bookmark (raises what it raises)."""
    found: list[Event] = []
    with anyio.fail_after(20):
        async with watcher(url, prefix).watch(scope, from_revision=start) as watch:
            async for item in watch:
                if isinstance(item, Bookmark):
                    return found
                found.append(item)
    raise AssertionError("the watch ended without a bookmark")


async def compacted(url: str, prefix: str, scope: str | None, start: str) -> Compacted:
    with pytest.raises(Compacted) as caught:
        await until_quiet(url, prefix, scope, start)
    return caught.value


async def write(store: StateStore, keys: list[str]) -> list[str]:
    """Set each key of `orders`; the revisions of their events."""
    for key in keys:
        await store.set("orders", key, {"key": key})
    return [e.revision for e in await store.events("orders") if e.key in keys]


async def test_a_revision_from_before_a_repair_is_compacted_one_after_it_resumes(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        before = await write(store, ["o-1", "o-2"])
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")
    client.flushall()

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        assert (await store.get("orders", "o-2")) == {"key": "o-2"}  # repaired at start
        after = await write(store, ["o-3", "o-4", "o-5"])
        error = await compacted(own_redis.url, prefix, "orders", before[0])
        assert error.details["reason"] == "restored" and error.details["revision"] == before[0]
        assert error.details["partition"] == keys.partition_of("orders")
        assert error.details["oldest_kept"] == after[0]
        assert f"the oldest revision kept is {after[0]}" in error.message
        # Every partition's: the first it reads names its own oldest (none: no event yet).
        error = await compacted(own_redis.url, prefix, None, before[0])
        assert error.details["reason"] == "restored"
        assert error.details["oldest_kept"] == (
            after[0] if error.details["partition"] == keys.partition_of("orders") else None)
        # Even from the very start ("0"): the events before the restore are gone.
        assert (await compacted(own_redis.url, prefix, "orders", "0")).details["reason"] \
            == "restored"
        # A revision of the new history resumes: every later event, no COMPACTED.
        resumed = await until_quiet(own_redis.url, prefix, "orders", after[0])
        assert [(e.key, e.revision) for e in resumed] == [("o-4", after[1]), ("o-5", after[2])]


async def test_a_revision_from_before_a_redis_started_anew_is_compacted(
        own_redis: RedisServer, prefix: str) -> None:
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        before = await write(store, ["o-1", "o-2"])
    own_redis.client().flushall()  # no snapshot: the prefix is new to this Redis again

    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        after = await write(store, ["o-3", "o-4"])
        error = await compacted(own_redis.url, prefix, "orders", before[1])
        assert error.details["reason"] == "new_history"
        assert error.details["oldest_kept"] == after[0]
        # "From the start" of a new history holds everything it has.
        whole = await until_quiet(own_redis.url, prefix, "orders", "0")
        assert [e.revision for e in whole] == after


async def test_a_revision_ahead_of_the_redis_is_compacted(
        redis_server: RedisServer, prefix: str) -> None:
    """A revision of another server whose clock was ahead: the events this Redis writes before
    it would be skipped, so the watch says so instead of waiting."""
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=PARTITIONS) as store:
        (written,) = await write(store, ["o-1"])
        ahead = f"{now_ms() + 3_600_000}-0"
        for scope in ("orders", None):
            error = await compacted(redis_server.url, prefix, scope, ahead)
            assert error.details["reason"] == "ahead" and error.details["revision"] == ahead
        assert [e.key for e in await until_quiet(redis_server.url, prefix, "orders", "0")] \
            == ["o-1"]
        assert (await until_quiet(redis_server.url, prefix, "orders", written)) == []
