"""Watches: every event after a revision, once, in order (one scope, one key, every scope,
while writers run); COMPACTED for a trimmed revision and for a watch that falls behind a trim;
progress bookmarks on a quiet watch; a killed connection loses and repeats nothing."""

from __future__ import annotations

import itertools
import os
import random
import select
import signal
import subprocess
import sys
import zlib
from collections.abc import Awaitable, Callable

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateStore
from stateworker.clock import rfc3339_ms
from stateworker.errors import Compacted, InvalidRequest, KeyTooLong
from stateworker.events.model import Bookmark, Event, document_json, revision_of
from stateworker.events.reader import PAGE, PartitionReader
from stateworker.events.watch import Watch
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PROGRESS_S = 0.2  # the tests' bookmark interval


def client(url: str, prefix: str, **overrides: object) -> StateClient:
    settings = Settings(redis_url=url, prefix=prefix, partitions=4,
                        watch_progress_s=PROGRESS_S, **overrides)  # type: ignore[arg-type]
    return StateClient(settings=settings, timeout=5)


async def events_of(watch: Watch, count: int, timeout: float = 20) -> list[Event]:
    """The next `count` events (bookmarks between them skipped), then the watch's next item,
    which must be a bookmark: nothing more (no repeat) came."""
    found: list[Event] = []
    with anyio.fail_after(timeout):
        async for item in watch:
            if isinstance(item, Event):
                found.append(item)
                if len(found) == count:
                    break
        after = await anext(watch)
    assert isinstance(after, Bookmark), f"an event more than the {count} expected: {after}"
    return found


async def while_watching(watch: Watch, work: Callable[[], Awaitable[None]],
                         expected: Callable[[], Awaitable[list[Event]]]
                         ) -> tuple[list[Event], list[Event]]:
    """Run `work` while a task reads the watch; once it is done, wait until the watch has
    handed on as many events as `expected()` lists and then gone quiet (a bookmark came
    after them). Returns (what the watch gave, what was expected)."""
    items: list[Event | Bookmark] = []

    async def consume() -> None:
        async for item in watch:
            items.append(item)

    def given() -> list[Event]:
        return [item for item in items if isinstance(item, Event)]

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await work()
        wanted = await expected()

        async def settled() -> bool:
            return len(given()) >= len(wanted) and isinstance(items[-1], Bookmark)

        await until(settled, 30, f"{len(wanted)} events and a bookmark after them")
        tg.cancel_scope.cancel()
    return given(), wanted


def rows(events: list[Event]) -> list[tuple[str, str, str, str, int, bytes]]:
    return [(e.revision, e.type, e.scope, e.key, e.version, bytes(e.new_value)) for e in events]


async def stream_events(store: StateStore, after: str) -> list[Event]:
    """Every event of every partition still in its stream with a revision after `after`."""
    state = store.state
    found: list[Event] = []
    for n in range(state.keys.partitions):
        found += (await PartitionReader(state.conn, state.keys, n).read_all()).events
    return [e for e in found if revision_of(e.revision) > revision_of(after)]


async def write(store: StateStore, scopes: list[str], writers: int, each: int) -> None:
    """`writers` tasks, each setting, updating and deleting keys of the scopes."""
    async def writer(w: int) -> None:
        rng = random.Random(w)
        for i in range(each):
            scope, key = rng.choice(scopes), f"k{rng.randrange(4)}"
            if i % 7 == 6:
                await store.delete(scope, key)
            else:
                await store.set(scope, key, {"w": w, "i": i})

    async with anyio.create_task_group() as tg:
        for w in range(writers):
            tg.start_soon(writer, w)


def partitions_of(scopes: list[str], partitions: int = 4) -> set[int]:
    return {zlib.crc32(s.encode()) % partitions for s in scopes}


# ---- resuming from a revision --------------------------------------------------------------
@pytest.mark.parametrize("with_key", [False, True], ids=["scope", "scope+key"])
async def test_a_watch_from_a_revision_gets_every_later_event_of_its_scope_once_in_order(
        redis_server: RedisServer, prefix: str, store: StateStore, with_key: bool) -> None:
    scopes = ["orders", "carts", "users", "audit"]
    await write(store, scopes, writers=4, each=40)
    mine = await store.events("orders")
    start = mine[len(mine) // 2].revision
    key = "k1" if with_key else None
    async with client(redis_server.url, prefix).watch("orders", key, start) as watch:
        async def expected() -> list[Event]:
            return [e for e in await store.events("orders", after=start)
                    if key is None or e.key == key]

        got, wanted = await while_watching(
            watch, lambda: write(store, scopes, writers=4, each=60), expected)
    assert len(wanted) > 10
    assert rows(got) == rows(wanted)


@pytest.mark.parametrize("page", [PAGE, 7], ids=["page-1000", "page-7"])
async def test_an_unscoped_watch_from_a_revision_merges_every_partition_once_in_revision_order(
        redis_server: RedisServer, prefix: str, store: StateStore, page: int) -> None:
    scopes = [f"s{i}" for i in range(12)]
    assert len(partitions_of(scopes)) == 4
    await write(store, scopes, writers=4, each=30)
    start = (await store.events("s3"))[-1].revision
    settings = client(redis_server.url, prefix).settings
    async with Watch(redis_server.url, settings, from_revision=start, page=page) as watch:
        got, expected = await while_watching(
            watch, lambda: write(store, scopes, writers=6, each=150),
            lambda: stream_events(store, start))
    assert sorted(rows(got)) == sorted(rows(expected))  # each event once
    revisions = [revision_of(e.revision) for e in got]
    assert revisions == sorted(revisions)  # in revision order across partitions
    for scope in scopes:  # and each scope exactly in its stream's order
        assert [e.revision for e in got if e.scope == scope] == \
            [e.revision for e in expected if e.scope == scope]


async def test_a_watch_without_a_revision_starts_at_the_current_end(
        redis_server: RedisServer, prefix: str, store: StateStore) -> None:
    await store.set("orders", "old", 1)
    await store.set("carts", "old", 1)
    for scope in ("orders", None):
        async with client(redis_server.url, prefix).watch(scope) as watch:
            await store.set("orders", "new", scope or "all")
            (got,) = await events_of(watch, 1)
            assert (got.key, bytes(got.new_value)) == ("new", f'"{scope or "all"}"'.encode())


async def test_a_watch_refuses_a_revision_that_is_not_one(
        redis_server: RedisServer, prefix: str) -> None:
    for bad in ("", "abc", "1-2-3", "-5", "1-", "99999999999999999999999-0"):
        with pytest.raises(InvalidRequest, match="from_revision"):
            client(redis_server.url, prefix).watch("s", from_revision=bad)
    with pytest.raises(InvalidRequest, match="scope"):
        client(redis_server.url, prefix).watch("bad \udc80 scope")


async def test_a_watch_refuses_a_name_no_write_could_take_naming_the_limit(
        redis_server: RedisServer, prefix: str) -> None:
    """A scope or key longer than `max_key_bytes` names nothing a write can make: a watch of
    it would wait for ever, so it is refused as a call naming it is."""
    watches = client(redis_server.url, prefix)
    limit = watches.settings.max_key_bytes
    for scope, key, field in (("s" * (limit + 1), None, "scope"), ("s", "k" * (limit + 1), "key")):
        with pytest.raises(KeyTooLong) as refused:
            watches.watch(scope, key=key)
        assert refused.value.details == {"path": f"$.{field}", "size": limit + 1, "limit": limit}
    async with watches.watch("s" * limit, key="k" * limit):  # (the limit itself is a name)
        pass


# ---- compaction ------------------------------------------------------------------------------
async def oldest_kept(raw: aredis.Redis, stream: str) -> str:
    ((first, _),) = await raw.xrange(stream, count=1)
    return str(first.decode())


async def test_a_revision_trimmed_by_maxlen_is_compacted_naming_the_oldest_kept(
        redis_server: RedisServer, prefix: str, raw: aredis.Redis) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               events_maxlen=10) as store:
        await store.set("orders", "k", 0)
        first = (await store.events("orders"))[0].revision
        for i in range(1, 300):  # MAXLEN ~ 10 trims whole stream nodes as it goes
            await store.set("orders", "k", i)
        stream = store.state.keys.for_scope("orders").events
        kept = await oldest_kept(raw, stream)
        assert revision_of(kept) > revision_of(first)
        for scope in ("orders", None):
            with pytest.raises(Compacted) as caught:
                async with client(redis_server.url, prefix).watch(scope, None, first) as watch:
                    await anext(watch)
            assert caught.value.code == "COMPACTED"
            assert caught.value.details["oldest_kept"] == kept
            assert f"oldest revision kept is {kept}" in caught.value.message
        # From a revision still kept: every later event, nothing to report.
        last = await store.events("orders", after=kept)
        async with client(redis_server.url, prefix).watch("orders", None, kept) as watch:
            assert rows(await events_of(watch, len(last))) == rows(last)


async def test_xtrim_minid_compacts_exactly_the_revisions_before_the_oldest_kept(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    written: list[Event] = []
    with anyio.fail_after(20):  # the oldest kept will start a millisecond (`<ms>-0`)
        while not any(revision_of(e.revision)[1] == 0 for e in written[4:-2]):
            await store.set("orders", f"k{len(written)}", len(written))
            written = await store.events("orders")
    at = next(i for i, e in enumerate(written) if i >= 4 and revision_of(e.revision)[1] == 0)
    stream = store.state.keys.for_scope("orders").events
    await raw.xtrim(stream, minid=written[at].revision, approximate=False)
    with pytest.raises(Compacted) as caught:
        async with client(redis_server.url, prefix).watch("orders", None,
                                                          written[at - 2].revision) as watch:
            await anext(watch)
    assert caught.value.details["oldest_kept"] == written[at].revision
    assert caught.value.details["revision"] == written[at - 2].revision
    async with client(redis_server.url, prefix).watch("orders", None,
                                                      written[at].revision) as watch:
        assert rows(await events_of(watch, len(written) - at - 1)) == rows(written[at + 1:])


async def test_a_trim_right_at_the_revision_is_not_compaction_when_redis_can_tell(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    """The oldest entry kept is `<ms>-<seq>` with seq > 0: the one before it was `<ms>-<seq-1>`,
    so a watch from that revision lost nothing; one from any earlier revision did."""
    written: list[Event] = []
    with anyio.fail_after(20):
        while not any(revision_of(e.revision)[1] > 0 for e in written[2:]):
            await write(store, ["orders"], writers=4, each=25)  # some share a millisecond
            written = await store.events("orders")
    at = next(i for i, e in enumerate(written) if i > 1 and revision_of(e.revision)[1] > 0)
    await raw.xtrim(store.state.keys.for_scope("orders").events, minid=written[at].revision,
                    approximate=False)
    async with client(redis_server.url, prefix).watch("orders", None,
                                                      written[at - 1].revision) as watch:
        assert rows(await events_of(watch, len(written) - at)) == rows(written[at:])
    with pytest.raises(Compacted):
        async with client(redis_server.url, prefix).watch("orders", None,
                                                          written[at - 2].revision) as watch:
            await anext(watch)


async def test_an_event_deleted_after_the_revision_is_compaction(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    for i in range(4):
        await store.set("orders", "k", i)
    written = await store.events("orders")
    await raw.xdel(store.state.keys.for_scope("orders").events, written[2].revision)
    with pytest.raises(Compacted) as caught:
        async with client(redis_server.url, prefix).watch("orders", None,
                                                          written[0].revision) as watch:
            await anext(watch)
    assert caught.value.details["oldest_kept"] == written[0].revision


async def test_a_watch_that_falls_behind_a_trim_raises_compacted_after_what_it_read(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    stream = store.state.keys.for_scope("orders").events
    for scope in ("orders", None):
        async with client(redis_server.url, prefix).watch(scope) as watch:
            for i in range(3):
                await store.set("orders", "k", i)
            first = await anext(watch)  # the read took all three; two wait in the watch
            assert isinstance(first, Event)
            for i in range(3, 8):
                await store.set("orders", "k", i)
            later = await store.events("orders", after=first.revision)
            await raw.xtrim(stream, minid=later[4].revision, approximate=False)  # 2 of the 5 unread are gone
            assert rows([await anext(watch), await anext(watch)]) == rows(later[:2])
            with pytest.raises(Compacted) as caught:
                await anext(watch)
            assert caught.value.details["oldest_kept"] == later[4].revision
            assert caught.value.details["revision"] == later[1].revision


async def test_a_trim_up_to_what_a_watch_has_read_is_not_compaction(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    """The watch counted every entry up to its cursor: a trim of all of them, and no more,
    lost nothing (the oldest entry kept is after the cursor, but it is the next one)."""
    stream = store.state.keys.for_scope("orders").events
    for scope in ("orders", None):
        async with client(redis_server.url, prefix).watch(scope) as watch:
            for i in range(3):
                await store.set("orders", "k", i)
            read = await events_of(watch, 3)
            for i in range(3, 6):
                await store.set("orders", "k", i)
            later = await store.events("orders", after=read[-1].revision)
            await raw.xtrim(stream, minid=later[0].revision, approximate=False)  # everything read, no more
            assert rows(await events_of(watch, 3)) == rows(later)


async def test_partitions_that_began_after_the_revision_lost_nothing(
        redis_server: RedisServer, prefix: str, store: StateStore) -> None:
    """Streams whose first entry is after the revision but that never lost one (entries
    added = entries kept) are read whole, not reported as compacted."""
    scopes = [f"s{i}" for i in range(8)]
    await store.set("s0", "first", 0)
    start = (await store.events("s0"))[0].revision
    await write(store, scopes, writers=2, each=20)
    expected = await stream_events(store, start)
    assert len({store.state.keys.partition_of(e.scope) for e in expected}) == 4
    async with client(redis_server.url, prefix).watch(from_revision=start) as watch:
        got = await events_of(watch, len(expected))
    assert sorted(rows(got)) == sorted(rows(expected))


async def test_an_unscoped_watch_names_the_partition_that_was_trimmed(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    scopes = [f"s{i}" for i in range(8)]
    await write(store, scopes, writers=2, each=20)
    start = (await stream_events(store, "0-0"))[0].revision
    await write(store, scopes, writers=2, each=20)
    part = store.state.keys.partition_of("s5")
    stream = store.state.keys.partition(part).events
    kept = (await raw.xrange(stream))[-2][0].decode()
    await raw.xtrim(stream, minid=kept, approximate=False)
    with pytest.raises(Compacted) as caught, anyio.fail_after(10):
        async with client(redis_server.url, prefix).watch(from_revision=start) as watch:
            async for _ in watch:
                pass
    assert caught.value.details["partition"] == part
    assert caught.value.details["oldest_kept"] == kept


# ---- bookmarks -------------------------------------------------------------------------------
async def test_a_quiet_watch_gets_bookmarks_and_resuming_from_one_rereads_nothing(
        redis_server: RedisServer, prefix: str, store: StateStore) -> None:
    async with client(redis_server.url, prefix).watch("orders") as watch:
        await store.set("orders", "a", 1)
        await store.set("orders", "b", 2)
        got = await events_of(watch, 2)  # a bookmark came after them
        marks: list[tuple[float, Bookmark]] = []
        with anyio.fail_after(10):
            while len(marks) < 3:
                item = await anext(watch)
                assert isinstance(item, Bookmark)
                marks.append((anyio.current_time(), item))
    assert {m.revision for _, m in marks} == {got[-1].revision}  # the latest examined
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(marks)]
    assert min(gaps) >= PROGRESS_S * 0.9  # one per quiet interval, not one per read
    async with client(redis_server.url, prefix).watch("orders", None,
                                                      marks[-1][1].revision) as watch:
        await store.set("orders", "c", 3)
        (only,) = await events_of(watch, 1)
    assert only.key == "c"


async def test_a_filtered_watch_bookmarks_past_the_events_it_passes_over(
        redis_server: RedisServer, prefix: str, store: StateStore) -> None:
    """Pages of 10 entries: the watch reads one round trip after another, finds nothing for
    it, and still sends one bookmark per quiet interval, each at the newest entry examined."""
    scopes = [f"s{i}" for i in range(8)]
    settings = client(redis_server.url, prefix).settings
    for scope in ("s1", None):
        async with Watch(redis_server.url, settings, scope=scope, key="wanted",
                         page=10) as watch:
            await write(store, scopes, writers=3, each=40)  # never the key "wanted"
            passed = [revision_of(e.revision) for e in await stream_events(store, "0-0")
                      if scope is None or store.state.keys.partition_of(e.scope)
                      == store.state.keys.partition_of(scope)]
            marks: list[float] = []
            with anyio.fail_after(10):
                while True:  # bookmarks only, up to the newest entry it examined
                    mark = await anext(watch)
                    marks.append(anyio.current_time())
                    assert isinstance(mark, Bookmark)
                    assert revision_of(mark.revision) <= max(passed)
                    if revision_of(mark.revision) == max(passed):
                        break
            assert all(b - a >= PROGRESS_S * 0.9 for a, b in itertools.pairwise(marks))
        async with client(redis_server.url, prefix).watch(scope, "wanted",
                                                          mark.revision) as watch:
            await store.set("s1", "wanted", 1)
            (only,) = await events_of(watch, 1)
            assert (only.scope, only.key) == ("s1", "wanted")


# ---- the command line ------------------------------------------------------------------------
class WatchCommand:
    """`stateworker watch ...` in a process of its own; its lines read with a time bound."""

    def __init__(self, url: str, prefix: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("STATEWORKER_") and k != "PYTHONUNBUFFERED"}
        # No STATEWORKER_PARTITIONS: the watch finds the prefix's count (4) in Redis.
        env.update(STATEWORKER_PREFIX=prefix, STATEWORKER_WATCH_PROGRESS_S=str(PROGRESS_S))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stateworker", "--redis-url", url, "watch", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def line(self, timeout: float = 8) -> bytes:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"no line within {timeout} s"
        return self.process.stdout.readline()

    def event_line(self) -> bytes:
        """The next line that is not a bookmark (one may come while the test writes)."""
        while (line := self.line()).startswith(b'{"type":"bookmark"'):
            pass
        return line

    def finish(self, timeout: float = 20) -> tuple[int, bytes]:
        """The exit status and what it wrote on stderr."""
        _, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


def scope_beyond_four() -> str:
    """A scope whose partition differs between 4 partitions and the default 16."""
    return next(s for s in (f"orders-{i}" for i in range(100))
                if zlib.crc32(s.encode()) % 16 != zlib.crc32(s.encode()) % 4)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
async def test_the_command_prints_one_json_line_per_event_and_bookmarks_until_stopped(
        redis_server: RedisServer, prefix: str, store: StateStore, stop: int) -> None:
    scope = scope_beyond_four()
    await store.set(scope, "o-1", {"total": 12.50})
    await store.call("state::update", {"scope": scope, "key": "o-1", "ops": [
        {"type": "increment", "path": "items", "by": 1}]})
    first, second = await store.events(scope)
    command = WatchCommand(redis_server.url, prefix, "--scope", scope, "--from", first.revision,
                           "--progress")  # (bookmarks printed only with it)
    try:
        assert command.line() == document_json(second) + b"\n"
        await store.delete(scope, "o-1")
        (third,) = await store.events(scope, after=second.revision)
        line = command.event_line()
        assert line == document_json(third) + b"\n"
        assert msgspec.json.decode(line) == {
            "type": "state", "event_type": "state:deleted", "scope": scope, "key": "o-1",
            "old_value": {"total": 12.50, "items": 1}, "new_value": None, "version": 2,
            "revision": third.revision, "ts": rfc3339_ms(third.ts_ms), "ts_ms": third.ts_ms,
            "by": None}
        for _ in range(2):  # quiet now: bookmarks at the last event
            assert msgspec.json.decode(command.line()) == {"type": "bookmark",
                                                           "revision": third.revision}
        command.process.send_signal(stop)
        assert command.finish() == (0, b"")  # quietly
    finally:
        command.kill()


async def test_the_command_reports_compacted_and_a_bad_revision(
        redis_server: RedisServer, prefix: str, store: StateStore, raw: aredis.Redis) -> None:
    for i in range(5):
        await store.set("orders", "k", i)
    written = await store.events("orders")
    await raw.xtrim(store.state.keys.for_scope("orders").events, minid=written[3].revision,
                    approximate=False)
    command = WatchCommand(redis_server.url, prefix, "--from", written[1].revision)
    try:
        status, err = command.finish()
    finally:
        command.kill()
    error = msgspec.json.decode(err)
    assert status == 1 and error["code"] == "COMPACTED"
    assert error["details"]["oldest_kept"] == written[3].revision
    command = WatchCommand(redis_server.url, prefix, "--from", "yesterday")
    try:
        status, err = command.finish()
    finally:
        command.kill()
    assert status == 2 and b'--from "yesterday" is not a revision' in err


# ---- reconnects ------------------------------------------------------------------------------
async def kill_watch_connections(raw: aredis.Redis) -> int:
    """CLIENT KILL every connection a watch reads on (its last command XREAD or EXEC)."""
    killed = 0
    for info in await raw.client_list():
        if info["cmd"] in ("xread", "exec"):
            killed += int(await raw.client_kill_filter(_id=info["id"]))
    return killed


async def test_a_killed_connection_loses_and_repeats_nothing(
        own_redis: RedisServer, prefix: str) -> None:
    scopes = [f"s{i}" for i in range(8)]
    raw = aredis.Redis(port=own_redis.port)
    kills = 0

    async def killer() -> None:
        nonlocal kills
        while True:
            kills += await kill_watch_connections(raw)
            await anyio.sleep(0.02)  # the pace of the kills; the watch reads in between

    try:
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            await write(store, scopes, writers=2, each=10)
            start = (await stream_events(store, "0-0"))[-1].revision
            async with client(own_redis.url, prefix).watch(from_revision=start) as watch, \
                    anyio.create_task_group() as tg:
                tg.start_soon(killer)
                got, expected = await while_watching(
                    watch, lambda: write(store, scopes, writers=4, each=150),
                    lambda: stream_events(store, start))
                tg.cancel_scope.cancel()
    finally:
        await raw.aclose()
    assert kills >= 3 and watch.transient["CONNECTION"] >= 3
    assert rows(got) == rows(sorted(expected, key=lambda e: revision_of(e.revision)))
