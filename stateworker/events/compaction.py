"""Has a partition stream lost events after a reader's cursor? (trimming, XDEL)

Streams lose their oldest entries to trimming: `XADD ... MAXLEN ~ events_maxlen` in the entry
scripts, `XTRIM MINID` by a trimmer. A reader that resumes from a revision needs every entry
after it; when one of them is gone, it must be told (`COMPACTED`), never skip silently.

What Redis 7.0 tells (`XINFO STREAM`, measured): `max-deleted-entry-id` moves only with XDEL,
not with XTRIM or XADD MAXLEN, so by itself it misses every trim. Trimming removes the oldest
entries, so what is kept is the newest part of the history (less what XDEL took, which
`max-deleted-entry-id` does record). So, for a cursor `c`:

- `max-deleted-entry-id > c`: an entry after `c` was deleted: lost.
- `last-generated-id <= c`: nothing was ever added after `c`: nothing lost.
- the oldest entry kept `<= c`: everything after `c` is still kept: nothing lost.
- otherwise every entry kept is after `c`, and the question is whether any entry between `c`
  and the oldest kept existed. A watch that counted the entries ever added up to its cursor
  (`entries-added` when it read to the end) knows: lost when `entries-added - counted >
  length`. Without a count: a stream that never lost an entry (`entries-added == length`)
  lost none after `c`; an oldest kept entry `<ms>-<seq>` with `seq > 0` names its
  predecessor (`<ms>-<seq-1>`: ids the scripts get from `XADD *` count up within a
  millisecond); with `seq == 0` the predecessor is unknown, and the answer is "lost" (a
  resume revision exactly at a trim's edge is the one case reported that lost nothing).

Trimming is not the only gap. A Redis rebuilt by `stateworker restore` (or the repair at
start) has new, empty event streams: the events between a revision from before and the restore
are in no stream, and the new stream's ids say nothing of them (a revision from before may be
older than, between or even ahead of them). A Redis that was wiped and started anew is the
same, without the restore. So each partition records where this Redis's history of it begins
(`sw:{sw:pN}:history`, `History`): `after`, a revision no event of the history is at or before
(Redis's clock, less a millisecond, when it began, or the stream's last id if later), and its
`cause`: `new` (the service found the prefix new in this Redis: a new server or a flushed one)
or `restore`. A cursor before `after` is a gap, except `0-0` ("from the start") in a `new`
history: nothing this Redis knows of came before it; after a restore events did, and are gone.
A cursor ahead of both the stream's last id and Redis's clock is not of this history either
(another server's, or a clock that went back): the events this stream adds before it would be
skipped. Only while it is ahead: once this Redis's clock and stream pass it, a revision says
nothing of the server that gave it, and the events this history wrote before it are skipped
(a new or restored Redis whose clock was behind the old one's ids: not told, an open limit).
A prefix created before the history key existed has none: only trimming is checked.

A Redis restarted on an older copy of its data (an older AOF or RDB, a replica promoted before
it synced) keeps its history record, and its stream goes back: events a reader already had
are in no stream, and the writes since give their revisions again with other changes. A
reader that counted the entries ever added up to its cursor sees the stream's `entries-added`
below that count plus the entries its read brings after the cursor (it never goes down in a
stream's life, and each entry after the cursor was added after the counted ones): a gap too
(`behind`). The entries read count too, because the writes since the restart bring the
total back up: 2 events lost and 2 written since, and `entries-added` alone equals the count.
A read that does not reach the stream's end cannot tell the whole count, so the reader also
asks for the entry at its cursor (one it read): a stream that keeps older entries and did not
XDEL it, yet lacks it, went back (`behind` again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stateworker.errors import Compacted, Unavailable
from stateworker.events.model import MAX_SEQ, Revision, revision_of, revision_text
from stateworker.keys import KeySpace
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ReplyError

# Why a cursor is compacted (`details.reason`).
TRIMMED = "trimmed"
NEW_HISTORY = "new_history"  # before the start of a new (or flushed) Redis's history
RESTORED = "restored"  # before a restore from the snapshot
AHEAD = "ahead"  # after everything this Redis has given and its clock
BEHIND = "behind"  # the stream has had fewer events than the reader counted: an older copy
CAUSES = ("new", "restore")


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What `XINFO STREAM` says about a partition stream's history."""

    length: int  # entries kept
    entries_added: int  # entries ever added
    last_generated: Revision  # the newest id ever given
    max_deleted: Revision  # the newest id XDEL removed (not trims: see the module docstring)
    first: Revision | None  # the oldest entry kept; None when none is


@dataclass(frozen=True, slots=True)
class History:
    """Where this Redis's event history of a partition begins (module docstring)."""

    after: Revision  # no event of the history is at or before it
    cause: str  # "new" or "restore"


def history_of(reply: Any) -> History | None:
    """`HMGET <history> after cause`'s reply; None when the partition has no record."""
    after, cause = reply
    if after is None:
        return None
    return History(revision_of(after), (cause or b"new").decode())


async def begin_history(conn: RedisConnection, keys: KeySpace, cause: str) -> None:
    """Record that every partition's event history begins now in this Redis. `new`: only
    where none is recorded (the first of replicas starting together wins); `restore`: over
    whatever was."""
    assert cause in CAUSES
    parts = keys.all_partitions()
    clock, *infos = await conn.pipeline([["TIME"], *[["XINFO", "STREAM", p.events]
                                                     for p in parts]])
    begun: Revision = (int(clock[0]) * 1000 + int(clock[1]) // 1000 - 1, MAX_SEQ)
    set_ = "HSETNX" if cause == "new" else "HSET"
    commands: list[list[Any]] = []
    for part, reply in zip(parts, infos, strict=True):
        info = stream_info(reply, part.events)
        after = begun if info is None else max(begun, info.last_generated)
        commands += [[set_, part.history, "after", revision_text(after)],
                     [set_, part.history, "cause", cause]]
    for reply in await conn.pipeline(commands):
        if isinstance(reply, ReplyError):
            raise Unavailable(f"Redis refused to record where the event history begins: {reply}",
                              {"key": keys.partition(0).history})


def stream_info(reply: Any, stream: str) -> StreamInfo | None:
    """`XINFO STREAM`'s reply (name/value pairs); None when the stream does not exist."""
    if isinstance(reply, ReplyError):
        if "no such key" in str(reply):
            return None
        raise Unavailable(f"Redis refused XINFO STREAM {stream}: {reply}", {"stream": stream})
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    first = fields.get(b"first-entry")
    return StreamInfo(
        length=int(fields[b"length"]), entries_added=int(fields[b"entries-added"]),
        last_generated=revision_of(fields[b"last-generated-id"]),
        max_deleted=revision_of(fields[b"max-deleted-entry-id"]),
        first=revision_of(first[0]) if first else None)


def lost_after(cursor: Revision, counted: int | None, info: StreamInfo | None) -> bool:
    """Whether an entry after `cursor` was deleted before it was read (module docstring).
    `counted`: the entries ever added up to the cursor, when known."""
    if info is None:  # no stream: nothing was ever added (or it was deleted whole)
        return False
    if info.max_deleted > cursor:
        return True
    if info.last_generated <= cursor or (info.first is not None and info.first <= cursor):
        return False
    # Every entry kept is after the cursor: were all those added after it kept? (Unknown
    # count: at least none were added up to the cursor, so a stream that never lost an entry
    # lost none after it.)
    if info.entries_added - (counted or 0) <= info.length:
        return False
    if counted is not None:
        return True
    if info.first is not None and info.first[1] > 0:
        return (info.first[0], info.first[1] - 1) > cursor
    return True


def gap(cursor: Revision, counted: int | None, info: StreamInfo | None,
        history: History | None, clock_ms: int, read: int = 0,
        kept: bool | None = None) -> str | None:
    """Why events after `cursor` cannot all be read (TRIMMED, NEW_HISTORY, RESTORED, AHEAD,
    BEHIND); None: every one of them is in the stream or still to come (module docstring).
    `read`: the entries after `cursor` that the read `info` came with (same transaction)
    brought, each one added after the `counted` ones; `kept`: whether the stream holds the
    entry at `cursor`, when `cursor` is an entry the reader read (None: it is not one)."""
    if history is not None and cursor < history.after:
        if history.cause == "restore":
            return RESTORED
        if cursor != (0, 0):
            return NEW_HISTORY
    if counted is not None and info is not None and info.entries_added < counted + read:
        return BEHIND
    if kept is False and info is not None and info.max_deleted < cursor \
            and info.first is not None and info.first < cursor:
        return BEHIND  # (neither trimmed from the front nor XDELed: gone back)
    newest = (0, 0) if info is None else info.last_generated
    if cursor > newest and cursor > (clock_ms, MAX_SEQ):
        return AHEAD
    return TRIMMED if lost_after(cursor, counted, info) else None


def counted_after(counted: int | None, info: StreamInfo | None, read: int,
                  to_the_end: bool) -> int | None:
    """The entries ever added up to the new cursor, after a read of `read` entries with
    nothing lost: all of them when the read reached the stream's end."""
    if info is None:
        return 0
    if to_the_end:
        return info.entries_added
    return None if counted is None else counted + read


def compacted(partition: int, cursor: Revision, info: StreamInfo | None,
              reason: str = TRIMMED, history: History | None = None) -> Compacted:
    """COMPACTED for a cursor after which events cannot all be read, naming the oldest kept."""
    oldest = None if info is None or info.first is None else revision_text(info.first)
    last = None if info is None else revision_text(info.last_generated)
    kept = (f"the oldest revision kept is {oldest}" if oldest is not None
            else f"no event of it is kept (the newest was {last})" if last is not None
            else "no event of it is kept")
    at = revision_text(cursor)
    why = {
        TRIMMED: f"events after it in partition {partition} were trimmed before they were read",
        RESTORED: f"partition {partition}'s events were restored from the snapshot after it, "
                  "without the events in between (a restore writes none)",
        NEW_HISTORY: f"it is from before partition {partition}'s event history in this Redis "
                     "(a new or flushed Redis): the events after it are in no stream",
        AHEAD: f"it is ahead of every event of partition {partition} and of Redis's clock: "
               "it is not a revision of this Redis, and the events before it would be skipped",
        BEHIND: f"partition {partition}'s stream lacks events that were read up to it (it "
                f"has had {info.entries_added if info else 0} added): Redis went "
                "back to an older copy of its data (a restart on an older AOF or RDB, a "
                "replica promoted before it synced), and the events read since are in no "
                "stream",
    }[reason]
    return Compacted(
        f"revision {at} is compacted: {why}; {kept}. Resync: read the current state, then "
        "start a new watch (without a revision it starts from now).",
        {"revision": at, "partition": partition, "oldest_kept": oldest, "newest": last,
         "reason": reason,
         "history_after": None if history is None else revision_text(history.after)})
