"""Watches: the change events of one scope, one key or every scope, in revision order, read
straight from the partition streams, resumable from any revision still kept.

`async with Watch(url, settings, scope="orders") as watch: async for item in watch: ...`
yields `Event`s and, after `watch_progress_s` without one, a `Bookmark` (the latest revision
examined). StateClient.watch() and `stateworker watch` are both this class.

Reading. Each partition has a cursor, the last stream id examined (`PartitionReader`'s rule:
a filter never makes it read an entry twice). A read (events/watch_reads.py: one transaction
on one server, one per partition on a Redis Cluster) brings the entries after each cursor and
tells whether events after it were trimmed, or the cursor is from before a restore or a new
Redis, or ahead of this Redis (`compaction.gap`): then COMPACTED, after the events read before
it. A transient Redis error is waited out and the read repeated from the same cursors.

Order. One partition's stream is totally ordered, so a scoped watch hands each event on as
read. An unscoped watch merges the partitions by revision: an entry read from one partition is
held until no partition can still bring an earlier one, i.e. until every other partition has
been read past it. A partition whose read reached its end has been read up to the server's
clock (`TIME` in the same transaction; on a cluster the clock of the primary holding it):
later entries get ids of at least that millisecond, since `XADD *` ids come from that clock.
So entries are handed on in revision order across partitions (two partitions can give the same
id in the same millisecond: those come in partition order), at the cost of at most a
millisecond's wait for the clock to pass the newest entry's. The order relies on Redis's clock
not going back; if it does, an event comes when it is read (later than its revision says),
never lost.

Position. `position` is the latest revision examined such that every entry up to it (in every
partition read) has been handed on or passed over, and none after it: a bookmark carries it,
and a watch resumed from it starts exactly there. Resuming from an event's revision is exact
for a scoped watch; for an unscoped one it is exact unless another partition has an event
with the very same revision (same millisecond and sequence) still to come right after it.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter, deque
from types import TracebackType
from typing import Any

import anyio

from stateworker.codec import sized_text
from stateworker.errors import KeyTooLong, StateError
from stateworker.events.compaction import (
    History,
    StreamInfo,
    compacted,
    counted_after,
    gap,
    history_of,
    stream_info,
)
from stateworker.events.model import (
    MAX_SEQ,
    Bookmark,
    Event,
    Revision,
    parse_revision,
    revision_of,
    revision_text,
    tx_ends,
    tx_missing,
    tx_rest,
)
from stateworker.events.reader import PAGE, PartitionReader
from stateworker.events.watch_reads import Partition, WatchReads, checked
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.retry import open_ready
from stateworker.transport.streamread import StreamReader

FOREVER: Revision = (MAX_SEQ + 1, 0)  # after every stream id
CLOCK_WAIT_MAX_S = 0.05  # the longest wait for Redis's clock to pass a held entry's millisecond


class Watch(WatchReads):
    """An async iterator of `Event | Bookmark` (module docstring); also an async context
    manager that closes its connection."""

    def __init__(self, url: str, settings: Settings, *, scope: str | None = None,
                 key: str | None = None, from_revision: str | None = None,
                 start_timeout_s: float = 10.0, page: int = PAGE) -> None:
        """A watch; nothing connects before `open()` (or `async with`, or the first item).

        Args:
            url: the Redis URL (`redis://` or `unix://`).
            settings: the prefix, the partition count (the prefix's stored count wins) and
                `watch_progress_s`, the quiet time after which a bookmark comes.
            scope: only this scope's events (its partition alone is read); None: every scope.
            key: only this key's events (of `scope`, or of every scope).
            from_revision: every event after this revision (`<ms>-<seq>`); None: only events
                that come after the watch opened.
            start_timeout_s: how long opening waits for a Redis that is away or loading.
            page: stream entries read per partition per round trip.

        Raises:
            InvalidRequest (INVALID_REQUEST): `from_revision` is not a revision, or scope or
                key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is longer than `max_key_bytes`.
        """
        for field, text in (("scope", scope), ("key", key)):
            if text is not None:  # (a longer one names nothing: no write takes it)
                sized_text(field, text, settings.max_key_bytes, KeyTooLong)
        self.url = url
        self.settings = settings
        self.scope, self.key = scope, key
        self.start = None if from_revision is None else parse_revision(from_revision)
        self.start_timeout_s = start_timeout_s
        self.page = page
        self.conn = connection_for(url, connect_timeout_s=settings.connect_timeout_s,
                                   read_timeout_s=settings.read_timeout_s)
        self.transient: Counter[str] = Counter()  # transient Redis states met, by kind
        self.position: Revision = (0, 0)  # see the module docstring
        self._parts: list[Partition] = []
        self._merge: list[tuple[Revision, int, Event | None]] = []  # held entries, a heap
        self._tx_end: dict[str, Revision] = {}  # a held transaction's last revision, by id
        self._blocked = False  # the merge's head waits for the rest of its transaction
        self._ready: deque[Event | Bookmark] = deque()
        self._failure: StateError | None = None  # raised once the events before it are out
        self._clock_us = 0  # Redis's clock at the last read (unscoped watches)
        self._frontier: Revision = (0, 0)  # every partition has been read up to here
        self._bookmark_at = 0.0
        self._opened = False
        # An unscoped watch on a Redis Cluster: its partitions are in several slots, so each
        # is read in a transaction of its own and waited on one by one (events/watch_reads.py).
        self._waits: StreamReader | None = None

    # ---- opening and closing -----------------------------------------------------------------
    async def open(self) -> Watch:
        """Connect, find the partitions and the starting cursors.

        Raises:
            Unavailable (UNAVAILABLE): no Redis answered within `start_timeout_s`.
            ConfigError: Redis refused the connection for good (e.g. NOAUTH).
        """
        if self._opened:
            return self
        await open_ready(self.conn, self.start_timeout_s, self._met, "the watch")
        self.conn = await probed(self.conn, as_user=False)  # one URL naming a cluster node
        prefix = self.settings.prefix
        (stored,) = await self._execute([["HGET", KeySpace(prefix, 1).meta, "partitions"]])
        keys = KeySpace(prefix, int(stored) if stored else self.settings.partitions)
        indexes = range(keys.partitions) if self.scope is None else [keys.partition_of(self.scope)]
        self._parts = [Partition(PartitionReader(self.conn, keys, n, scope=self.scope,
                                                  key=self.key),
                                  keys.partition(n).history, n, i, self.start or (0, 0), None)
                       for i, n in enumerate(indexes)]
        if isinstance(self.conn, ClusterConnection) and len(self._parts) > 1:
            self._waits = StreamReader(self.conn)  # (its blocking reads on lanes of their own)
        if self.start is not None:
            self.position = self.start
        else:  # from now: each partition from its newest id, all it ever had counted
            await self._from_now()
        self._bookmark_at = time.monotonic() + self.settings.watch_progress_s
        self._opened = True
        return self

    async def close(self) -> None:
        if self._waits is not None:
            await self._waits.close()
        await self.conn.close()

    aclose = close

    async def __aenter__(self) -> Watch:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ---- iteration -----------------------------------------------------------------------------
    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event | Bookmark:
        """The next event, or a bookmark after `watch_progress_s` without one.

        Raises:
            Compacted (COMPACTED): events after the watch's cursor (its `from_revision`, or
                where it had read to) were trimmed before it read them, or the cursor is not
                of this Redis's history (compaction.gap); every event before them has been
                handed on. The watch is over.
            Unavailable (UNAVAILABLE): Redis refused a read for good (not a transient state:
                those are waited out).
        """
        if not self._opened:
            await self.open()
        while not self._ready:
            if self._failure is not None:
                raise self._failure
            await self._step()
        self._bookmark_at = time.monotonic() + self.settings.watch_progress_s
        return self._ready.popleft()

    async def _step(self) -> None:
        """Read (now, or once Redis's clock has passed a held entry, or once something came),
        then hand on what can go; a bookmark when nothing went for `watch_progress_s`."""
        if any(p.more and self._may_read(p) for p in self._parts):
            await self._read()
        elif self._merge:  # held only for Redis's clock to pass their millisecond
            await anyio.sleep(self._clock_wait_s())
            await self._read()
        else:
            await self._read(wait_s=max(self._bookmark_at - time.monotonic(), 0.0))
        # (A watch from now starts at the newest id of all partitions: its first bookmark
        # waits until every partition has been read past that.)
        if (not self._ready and self._failure is None and self.position <= self._frontier
                and time.monotonic() >= self._bookmark_at):
            self._ready.append(Bookmark(revision=revision_text(self.position)))

    def _clock_wait_s(self) -> float:
        """Until Redis's clock (as of the last read) has passed the oldest held entry's ms."""
        oldest_ms = self._merge[0][0][0]
        return min(max((oldest_ms + 1) * 1000 - self._clock_us, 1) / 1e6, CLOCK_WAIT_MAX_S)

    async def _read(self, wait_s: float = 0.0) -> None:
        """Read the partitions not full in the merge (once something came to one of them, or
        `wait_s` passed), then hand on what can go."""
        parts = [p for p in self._parts if self._may_read(p)]  # the others wait in the merge
        if not isinstance(self.conn, ClusterConnection):  # (the wait and the read: one pipeline)
            reads = await self._read_together(parts, wait_s)
        else:
            if wait_s > 0:
                await self._wait(wait_s)
            reads = await (self._read_together(parts) if self._waits is None
                           else self._read_each(parts))
        if reads:  # (a held entry waits for every clock read to pass its millisecond)
            self._clock_us = min(clock_us for *_, clock_us, _ in reads)
        for part in self._parts:
            part.frontier = part.cursor
        for part, reply, recorded, entries, clock_us, at_cursor in reads:
            info = stream_info(reply, part.reader.stream)
            if self._compacted(part, info, history_of(recorded), clock_us // 1000,
                               len(entries), at_cursor if part.at_entry else None):
                continue
            if cut := tx_missing(entries):  # (a watch never shows half a transaction)
                entries = entries + tx_rest(cut[0], checked((await self._execute([[
                    "XRANGE", part.reader.stream, f"({entries[-1][0].decode()}", "+", "COUNT",
                    cut[1]]]))[0]))
            self._take(part, entries)
            to_the_end = len(entries) < self.page
            part.counted = counted_after(part.counted, info, len(entries), to_the_end)
            part.more = not to_the_end
            # Every entry of a partition that reached its end has been read up to the clock
            # of the Redis holding it (its entries' ids come from that clock).
            at_end: Revision = (clock_us // 1000 - 1, MAX_SEQ) if len(self._parts) > 1 \
                else FOREVER
            part.frontier = at_end if to_the_end else part.cursor
        self._release()

    def _compacted(self, part: Partition, info: StreamInfo | None, history: History | None,
                   clock_ms: int, read: int, kept: bool | None) -> bool:
        """Whether events after the partition's cursor cannot all be read (`read`, `kept`:
        compaction.gap's): the watch's failure (once the events before are out) and the
        partition read no more."""
        reason = gap(part.cursor, part.counted, info, history, clock_ms, read, kept)
        if reason is None:
            return False
        self._failure = self._failure or compacted(part.number, part.cursor, info, reason,
                                                   history)
        part.more = False
        return True

    def _take(self, part: Partition, entries: list[Any]) -> None:
        for entry_id, event in part.reader.sift(entries):
            heapq.heappush(self._merge, (revision_of(entry_id), part.index, event))
        for tx, end in tx_ends(entries).items():
            self._tx_end[tx] = max(end, self._tx_end.get(tx, end))
        if entries:
            part.held += len(entries)
            part.cursor = revision_of(entries[-1][0])
            part.at_entry = True

    def _may_read(self, part: Partition) -> bool:
        """A full partition waits in the merge, unless a transaction holds the merge up: then
        the others are read on until the frontier passes its end."""
        return part.held < self.page or self._blocked

    def _release(self) -> None:
        """Hand on every held entry no partition can still precede (module docstring), a
        transaction's events only once the frontier has passed its last one (its partition's
        read brought them all: `tx_missing`), so the position is never inside one."""
        frontier = self._frontier = min(p.frontier for p in self._parts)
        self._blocked = False
        while self._merge and self._merge[0][0] <= frontier:
            revision, index, event = self._merge[0]
            if event is not None and event.tx is not None and \
                    self._tx_end.get(event.tx, revision) > frontier:
                self._blocked = True
                break
            heapq.heappop(self._merge)
            self._parts[index].held -= 1
            self.position = max(self.position, revision)
            if event is not None:
                self._ready.append(event)
        for tx in [tx for tx, end in self._tx_end.items() if end <= self.position]:
            del self._tx_end[tx]

