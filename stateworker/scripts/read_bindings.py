"""The bindings of the scripts that read a scope's entries in pages or at once (state/kv/
reads.py, listing.py, pages.py, bulkread.py; state/query): list, entries, getmany, pages.
Each as bindings.py says of every binding: its script's KEYS and ARGV built in one place, its
reply read into a typed tuple; `bindings.BINDINGS` lists them with the others."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from stateworker.clock import now_ms
from stateworker.keys import PartitionKeys, member
from stateworker.scripts.library import Binding, Held
from stateworker.scripts.replies import EntriesReply, GetManyReply, ListReply, PageReply
from stateworker.transport.wire import Arg

Call = tuple[list[Arg], list[Arg]]  # a script call's KEYS and ARGV (as bindings.Call)


def pattern_arg(pattern: str | None) -> str:
    """An optional pattern: "" for none, else "=" + pattern (an empty pattern is a pattern)."""
    return "" if pattern is None else "=" + pattern

READ = Held("none")  # (what they write, a page's snapshot, is gone in 120 s: nothing to hold)
LIST = Binding("list", 1, 6, ListReply.read, held=READ)
ENTRIES = Binding("entries", 2, 14, EntriesReply.read, held=READ)
GETMANY = Binding("getmany", 1, 3, GetManyReply.read, tail=True, held=READ)  # the keys
PAGES = Binding("pages", 4, 14, PageReply.read, held=READ)  # list_entries: a snapshot's page


def list_call(part: PartitionKeys, scope: str, what: str, after: bytes | None = None,
              most: int = 1000, budget: int = 1 << 20) -> Call:
    """list.lua: one chunk of the scope's live keys or values, from the first key after
    `after` (None: from the first), at most `most` keys read and about `budget` bytes of
    entries."""
    start = b"-" if after is None else b"(" + after
    return [part.key_index(scope)], [now_ms(), part.entry_prefix + member(scope, ""), what,
                                     start, most, budget]


def entries_call(part: PartitionKeys, scope: str, index: str, order_by: str, order: str,
                 position: bytes, score: str, limit: int, skip: int, prefix: str | None,
                 key_pattern: str | None, topic_pattern: str | None, values: bool,
                 examine: int, max_bytes: int | None = None) -> Call:
    """entries.lua over one of the scope's indexes (`index`), from `position` ("" or "=" +
    the cursor's member); topic order walks the key index too (the untagged entries);
    `max_bytes`: the walk stops once the values returned reach it."""
    return ([index, part.key_index(scope)],
            [now_ms(), part.entry_prefix + member(scope, ""), order_by, order, position, score,
             limit, skip, prefix or "", pattern_arg(key_pattern), pattern_arg(topic_pattern),
             "1" if values else "", examine, "" if max_bytes is None else max_bytes])


def getmany_call(part: PartitionKeys, scope: str, keys: Sequence[str], budget: int) -> Call:
    """getmany.lua: the scope's entries named `keys`, in that order, and values of at most
    `budget` bytes in all."""
    return [part.key_index(scope)], [now_ms(), part.entry_prefix + member(scope, ""), budget,
                                     *keys]


class PageBounds(NamedTuple):
    """What bounds pages.lua's snapshots: entries, bytes of their rows, live snapshots of a
    partition, a snapshot's life (ms), bytes of one row, live snapshots of one caller in a
    partition (its share)."""

    entries: int
    bytes: int
    snapshots: int
    life_ms: int
    row_bytes: int
    per_caller: int


def pages_call(part: PartitionKeys, scope: str, cursor: str | None, next_cursor: str,
               binding: str, limit: int, max_bytes: int, bounds: PageBounds,
               caller: str) -> Call:
    """pages.lua: the page of `cursor`'s snapshot (None: capture the scope first), the
    snapshot renamed to `next_cursor`'s when pages remain; `binding`: what the cursor serves;
    `caller`: whose share of the partition's snapshots a capture takes."""
    after = part.snapshot(next_cursor)
    return ([part.key_index(scope), after if cursor is None else part.snapshot(cursor), after,
             part.snapshots],
            [now_ms(), "1" if cursor is None else "", part.entry_prefix + member(scope, ""),
             binding, limit, max_bytes, next_cursor, *bounds, caller])
