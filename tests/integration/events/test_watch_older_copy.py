"""A watch across a Redis restarted on an older copy of its data (an older AOF, a replica
promoted before it synced): the events it already handed on are in no stream of that Redis,
and the writes after the restart give their revisions again with other changes. The watch
raises COMPACTED (`details.reason` `behind`) instead of going on as if its history held."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest

from stateworker import StateError, StateStore
from stateworker.errors import Compacted
from stateworker.events.model import Event
from stateworker.events.reader import PAGE
from stateworker.events.watch import Watch
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.events.test_watch import PROGRESS_S, client, events_of
from tests.integration.snapshot.test_lost_redis import swap_data
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def settings_of(url: str, prefix: str) -> Settings:
    return Settings(redis_url=url, prefix=prefix, partitions=4, watch_progress_s=PROGRESS_S)


async def written(store: StateStore, value: Any) -> None:
    """s/k set to `value`, retried while the store's connection still meets the old socket."""
    done: list[bool] = []

    async def attempt() -> bool:
        try:
            await store.set("s", "k", value)
            done.append(True)
        except StateError as exc:
            assert exc.code == "UNAVAILABLE", exc
        return bool(done)
    await until(attempt, 10, f"the write of {value}")



async def until_compacted(watch: Any, most: int
                          ) -> tuple[list[tuple[int, bytes]], Compacted | None]:
    """The events the watch hands on (version, value), up to `most`, and the COMPACTED it
    ends with (None: it handed `most` on without one)."""
    got: list[tuple[int, bytes]] = []
    with anyio.fail_after(20):
        try:
            async for item in watch:
                if isinstance(item, Event):
                    got.append((item.version, bytes(item.new_value)))
                    if len(got) == most:
                        break
        except Compacted as exc:
            return got, exc
    return got, None

async def test_a_watch_over_a_redis_restarted_on_an_older_copy_is_compacted(
        own_redis: RedisServer, prefix: str, tmp_path: Path) -> None:
    older = tmp_path / "older"
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
        for n in (1, 2, 3):
            await written(store, n)
        first = (await store.get_entry("s", "k")).revision
        assert first is not None
        own_redis.kill(signal.SIGTERM)  # (a clean stop: a complete AOF to copy)
        shutil.copytree(own_redis.directory, older)
        own_redis.start()
        async with client(own_redis.url, prefix).watch("s", from_revision=first) as watch:
            await written(store, 4)
            await written(store, 5)
            seen = await events_of(watch, 2)  # (read to the stream's end: then a bookmark)
            assert [bytes(e.new_value) for e in seen] == [b"4", b"5"]
            swap_data(own_redis, older)  # back to 1, 2, 3
            await written(store, "other")  # version 4 again, another value
            got, compacted = await until_compacted(watch, 1)
    # Before the fix: [(4, b'"other"')], handed on as if it followed version 5.
    assert got == []
    assert compacted is not None and compacted.details["reason"] == "behind"


@pytest.mark.parametrize(("before", "writes_after", "page"),
                         [(3, 2, PAGE), (3, 5, 2), (0, 2, PAGE)])
async def test_writes_after_the_restart_that_make_up_the_count_do_not_hide_it(
        own_redis: RedisServer, prefix: str, tmp_path: Path, before: int, writes_after: int,
        page: int) -> None:
    """The older copy lacks the 2 events the watch had read; as many writes (or more) before
    the watch's next read bring the stream's `entries-added` back to what the watch counted
    (and past it), but they are not the events it read: still COMPACTED, before any of them:
    when they are more than the lost ones and a page (a read that does not reach the stream's
    end cannot tell the count), and when the copy held no event of the partition at all (no
    older entry to show the one at the cursor missing)."""
    older = tmp_path / "older"
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
        for n in range(1, before + 1):
            await written(store, n)
        first = (await store.get_entry("s", "k")).revision if before else None
        own_redis.kill(signal.SIGTERM)
        shutil.copytree(own_redis.directory, older)
        own_redis.start()
        async with Watch(own_redis.url, settings_of(own_redis.url, prefix), scope="s",
                         from_revision=first, page=page) as watch:
            await watch.open()  # (from now: before the writes)
            await written(store, "read-1")
            await written(store, "read-2")
            seen = await events_of(watch, 2)
            assert [bytes(e.new_value) for e in seen] == [b'"read-1"', b'"read-2"']
            swap_data(own_redis, older)  # back to the `before` writes
            for n in range(writes_after):  # the read versions again, other values
                await written(store, f"other-{n}")
            got, compacted = await until_compacted(watch, writes_after)
    # Before the fix: (3, 2, PAGE) [(4, b'"other-0"'), (5, b'"other-1"')], as if they followed
    # version 5 "read-2", and the watch went on; (3, 5, 2) with the count alone: the first
    # page, the same two, then COMPACTED; (0, 2, PAGE) without the entries read counted:
    # [(1, b'"other-0"'), (2, b'"other-1"')].
    assert got == []
    assert compacted is not None and compacted.details["reason"] == "behind"
