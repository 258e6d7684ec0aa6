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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stateworker.errors import Compacted, Unavailable
from stateworker.events.model import Revision, revision_of, revision_text
from stateworker.transport.wire import ReplyError


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """What `XINFO STREAM` says about a partition stream's history."""

    length: int  # entries kept
    entries_added: int  # entries ever added
    last_generated: Revision  # the newest id ever given
    max_deleted: Revision  # the newest id XDEL removed (not trims: see the module docstring)
    first: Revision | None  # the oldest entry kept; None when none is


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


def counted_after(counted: int | None, info: StreamInfo | None, read: int,
                  to_the_end: bool) -> int | None:
    """The entries ever added up to the new cursor, after a read of `read` entries with
    nothing lost: all of them when the read reached the stream's end."""
    if info is None:
        return 0
    if to_the_end:
        return info.entries_added
    return None if counted is None else counted + read


def compacted(partition: int, cursor: Revision, info: StreamInfo | None) -> Compacted:
    """COMPACTED for a cursor after which events were trimmed, naming the oldest kept."""
    oldest = None if info is None or info.first is None else revision_text(info.first)
    last = None if info is None else revision_text(info.last_generated)
    kept = (f"the oldest revision kept is {oldest}" if oldest is not None
            else f"no event of it is kept (the newest was {last})")
    return Compacted(
        f"revision {revision_text(cursor)} is compacted: events after it in partition "
        f"{partition} were trimmed before they were read; {kept}. Resync: read the current "
        "state, then start a new watch (without a revision it starts from now).",
        {"revision": revision_text(cursor), "partition": partition, "oldest_kept": oldest,
         "newest": last})
