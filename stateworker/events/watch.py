"""Watches: the change events of one scope, one key or every scope, in revision order, read
straight from the partition streams, resumable from any revision still kept.

`async with Watch(url, settings, scope="orders") as watch: async for item in watch: ...`
yields `Event`s and, after `watch_progress_s` without one, a `Bookmark` (the latest revision
examined). StateClient.watch() and `stateworker watch` are both this class.

Reading. Each partition has a cursor, the last stream id examined (`PartitionReader`'s rule:
a filter never makes it read an entry twice). One read is one transaction (MULTI ... EXEC):
`XINFO STREAM` of each partition read, one `XREAD COUNT <page>` of them all, `TIME`. Being
atomic, the XINFO tells exactly whether events after the cursor were trimmed before this read
(`compaction.lost_after`), and the partition's history record (read in it too) whether the
cursor is from before a restore or a new Redis, or ahead of this Redis (`compaction.gap`):
then COMPACTED, after the events read before it. When a read finds
nothing, the watch waits with `XREAD BLOCK` on every partition it reads (its reply only says
"something came"; the transaction reads it), at most until the next bookmark is due. A
transient Redis error (broken connection, LOADING ...) is waited out with `Backoff` and the
read repeated from the same cursors: cursors move only with a read's reply, so nothing is lost
or repeated across reconnects.

On a Redis Cluster an unscoped watch's partitions are in several slots, and Redis refuses an
XREAD or a MULTI across slots (even on one node). There each partition is read in a
transaction of its own (its XINFO, history, XREAD and its primary's TIME), all sent at once
(one pipeline per primary: as many round trips as one server's single read, in parallel), and
the wait is transport/streamread.py's (one blocking XREAD per slot, the first answer ends the
others). The single-server read
is unchanged: one transaction, one round trip.

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

from stateworker.errors import InvalidRequest, StateError, Unavailable
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
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.connection import shown_url
from stateworker.transport.retry import Backoff, open_ready, transient_reason
from stateworker.transport.slot_transactions import transactions_by_slot
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

FOREVER: Revision = (MAX_SEQ + 1, 0)  # after every stream id
# One partition's read: the partition, its XINFO STREAM and history replies, the entries read,
# the clock (µs) of the Redis that holds it, all from one transaction.
PartitionRead = tuple["_Partition", Any, Any, list[Any], int]
CLOCK_WAIT_MAX_S = 0.05  # the longest wait for Redis's clock to pass a held entry's millisecond


class _Partition:
    """One partition as the watch reads it."""

    __slots__ = ("counted", "cursor", "frontier", "held", "history", "index", "more", "number",
                 "reader")

    def __init__(self, reader: PartitionReader, history: str, number: int, index: int,
                 cursor: Revision, counted: int | None) -> None:
        self.reader = reader
        self.history = history  # its history key (compaction.History)
        self.number = number  # the partition's number in the key space
        self.index = index  # its place in the watch's list (the merge refers to it)
        self.cursor = cursor  # the last stream id examined
        self.counted = counted  # entries ever added up to the cursor (compaction.py); None: unknown
        self.held = 0  # its entries read but waiting in the merge for other partitions
        self.more = True  # it may hold entries after the cursor that no read has brought yet
        self.frontier = cursor  # every entry of it up to here has been read


class Watch:
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
        """
        for field, text in (("scope", scope), ("key", key)):
            if text is not None:
                _check_text(field, text)
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
        self._parts: list[_Partition] = []
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
        # is read in a transaction of its own and waited on one by one (module docstring).
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
        self._parts = [_Partition(PartitionReader(self.conn, keys, n, scope=self.scope,
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

    async def _from_now(self) -> None:
        """Each partition's cursor at its newest id (or where its history begins, if later),
        every entry it ever had counted."""
        each: list[list[list[Arg]]] = [
            [["XINFO", "STREAM", p.reader.stream], ["HMGET", p.history, "after", "cause"]]
            for p in self._parts]
        if self._waits is None:  # one transaction
            replies = await self._transaction([command for pair in each for command in pair])
            pairs = list(zip(replies[0::2], replies[1::2], strict=True))
        else:  # one per partition (slot)
            pairs = [(info, recorded) for info, recorded in await self._transactions(
                each, [p.reader.stream for p in self._parts])]
        for part, (reply, recorded) in zip(self._parts, pairs, strict=True):
            info, history = stream_info(reply, part.reader.stream), history_of(recorded)
            part.cursor = part.frontier = max(
                (0, 0) if info is None else info.last_generated,
                (0, 0) if history is None else history.after)
            part.counted = 0 if info is None else info.entries_added
        self.position = max(p.cursor for p in self._parts)

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
            left = self._bookmark_at - time.monotonic()
            if left > 0:
                await self._wait(left)
            await self._read()
        # (A watch from now starts at the newest id of all partitions: its first bookmark
        # waits until every partition has been read past that.)
        if (not self._ready and self._failure is None and self.position <= self._frontier
                and time.monotonic() >= self._bookmark_at):
            self._ready.append(Bookmark(revision=revision_text(self.position)))

    def _clock_wait_s(self) -> float:
        """Until Redis's clock (as of the last read) has passed the oldest held entry's ms."""
        oldest_ms = self._merge[0][0][0]
        return min(max((oldest_ms + 1) * 1000 - self._clock_us, 1) / 1e6, CLOCK_WAIT_MAX_S)

    async def _wait(self, seconds: float) -> None:
        """Block until an entry comes to a partition read (its reply is dropped: the next read
        takes it with the compaction check) or `seconds` pass."""
        streams, cursors = self._cursors(self._parts)
        block_ms = max(int(seconds * 1000), 1)
        try:
            if self._waits is not None:
                await self._waits.read(["XREAD", "COUNT", 1, "BLOCK", block_ms], streams, cursors)
            else:
                await self.conn.execute("XREAD", "COUNT", 1, "BLOCK", block_ms,
                                        "STREAMS", *streams, *cursors)
        except anyio.get_cancelled_exc_class():
            # The XREAD stays blocked in Redis: a read after it would queue behind it.
            if self._waits is None:  # (StreamReader ends its own blocked reads)
                with anyio.CancelScope(shield=True):
                    await self.conn.close()
            raise
        except (ConnectionLost, ReplyError) as exc:
            # Not repeated here: the read that follows rides it out (with backoff), and a
            # repeated wait would start its whole time again.
            self._refused(exc)
            self._met(exc)

    async def _read(self) -> None:
        """Read the partitions not full in the merge, then hand on what can go."""
        parts = [p for p in self._parts if self._may_read(p)]  # the others wait in the merge
        reads = await (self._read_together(parts) if self._waits is None
                       else self._read_each(parts))
        if reads:  # (a held entry waits for every clock read to pass its millisecond)
            self._clock_us = min(clock_us for *_, clock_us in reads)
        for part in self._parts:
            part.frontier = part.cursor
        for part, reply, recorded, entries, clock_us in reads:
            info = stream_info(reply, part.reader.stream)
            if self._compacted(part, info, history_of(recorded), clock_us // 1000):
                continue
            if cut := tx_missing(entries):  # (a watch never shows half a transaction)
                entries = entries + tx_rest(cut[0], _checked((await self._execute([[
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

    async def _read_together(self, parts: list[_Partition]) -> list[PartitionRead]:
        """One transaction: each partition's XINFO and history, one XREAD of them all, TIME."""
        streams, cursors = self._cursors(parts)
        count = len(parts)
        commands: list[list[Arg]] = [["XINFO", "STREAM", s] for s in streams]
        commands += [["HMGET", p.history, "after", "cause"] for p in parts]
        commands += [["XREAD", "COUNT", self.page, "STREAMS", *streams, *cursors], ["TIME"]]
        replies = await self._transaction(commands)
        read = {name.decode(): entries for name, entries in _checked(replies[-2]) or []}
        clock_us = _micros(_checked(replies[-1]))
        return [(part, reply, recorded, read.get(part.reader.stream, []), clock_us)
                for part, reply, recorded in zip(parts, replies[:count],
                                                 replies[count:2 * count], strict=True)]

    async def _read_each(self, parts: list[_Partition]) -> list[PartitionRead]:
        """On a Redis Cluster: one transaction per partition (one slot), all sent at once (one
        pipeline per primary): its XINFO, history, XREAD and its primary's TIME."""
        replies = await self._transactions([
            [["XINFO", "STREAM", p.reader.stream], ["HMGET", p.history, "after", "cause"],
             ["XREAD", "COUNT", self.page, "STREAMS", p.reader.stream, revision_text(p.cursor)],
             ["TIME"]] for p in parts], [p.reader.stream for p in parts])
        reads: list[PartitionRead] = []
        for part, (reply, recorded, read, clock) in zip(parts, replies, strict=True):
            entries = _checked(read)[0][1] if _checked(read) else []
            reads.append((part, reply, recorded, entries, _micros(_checked(clock))))
        return reads

    def _compacted(self, part: _Partition, info: StreamInfo | None, history: History | None,
                   clock_ms: int) -> bool:
        """Whether events after the partition's cursor cannot all be read: the watch's failure
        (once the events before are out) and the partition read no more."""
        reason = gap(part.cursor, part.counted, info, history, clock_ms)
        if reason is None:
            return False
        self._failure = self._failure or compacted(part.number, part.cursor, info, reason,
                                                   history)
        part.more = False
        return True

    def _take(self, part: _Partition, entries: list[Any]) -> None:
        for entry_id, event in part.reader.sift(entries):
            heapq.heappush(self._merge, (revision_of(entry_id), part.index, event))
        for tx, end in tx_ends(entries).items():
            self._tx_end[tx] = max(end, self._tx_end.get(tx, end))
        if entries:
            part.held += len(entries)
            part.cursor = revision_of(entries[-1][0])

    def _may_read(self, part: _Partition) -> bool:
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

    # ---- Redis ---------------------------------------------------------------------------------
    @staticmethod
    def _cursors(parts: list[_Partition]) -> tuple[list[str], list[str]]:
        return [p.reader.stream for p in parts], [revision_text(p.cursor) for p in parts]

    def _met(self, error: BaseException) -> None:
        self.transient[transient_reason(error) or str(error).split(" ", 1)[0] or "OTHER"] += 1

    async def _transaction(self, commands: list[list[Arg]]) -> list[Any]:
        """The replies of `commands` run as one MULTI ... EXEC."""
        replies = await self._execute([["MULTI"], *commands, ["EXEC"]])
        return list(_checked(replies[-1]))

    async def _transactions(self, each: list[list[list[Arg]]], keys: list[str]
                            ) -> list[list[Any]]:
        """On a Redis Cluster: the replies of each command list (all of the slot of its key
        in `keys`) run as a MULTI ... EXEC of its own. Those of one primary go back to back in
        one pipeline, the primaries' side by side. A transient failure is waited out with
        backoff and they are grouped and sent again (a slot that moved: its new primary)."""
        backoff = Backoff()
        while True:
            try:
                assert isinstance(self.conn, ClusterConnection)
                return await transactions_by_slot(self.conn, each, keys)
            except (ConnectionLost, ReplyError) as exc:
                self._refused(exc)
                self._met(exc)
                await anyio.sleep(backoff.next())

    async def _execute(self, commands: list[list[Arg]]) -> list[Any]:
        """Run commands (they only read); a transient failure is waited out with backoff and
        they run again, for as long as it takes: a watch rides out Redis restarts."""
        backoff = Backoff()
        while True:
            try:
                replies = await self.conn.pipeline(commands)
                for reply in replies:
                    _checked(reply)
                return replies
            except (ConnectionLost, ReplyError) as exc:
                self._refused(exc)
                self._met(exc)
                await anyio.sleep(backoff.next())

    def _refused(self, error: ConnectionLost | ReplyError) -> None:
        """Raise UNAVAILABLE for an error that is not transient (Redis will refuse it again).
        On a Redis Cluster a transaction discarded (EXECABORT) is transient too: its commands
        met MOVED or ASK (its slot moved or is moving), the connection read the map again,
        and the transaction, sent again, goes to the new primary; so is a MOVED or ASK that
        ended a wait (StreamReader: the map is read again before the next read)."""
        moved = isinstance(self.conn, ClusterConnection) and str(error).startswith(
            ("EXECABORT", "MOVED", "ASK"))
        if transient_reason(error) is None and not moved:
            raise Unavailable(f"Redis at {shown_url(self.url)} refused a watch's read: {error}",
                              {"redis": shown_url(self.url)}) from error


def _checked(reply: Any) -> Any:
    if isinstance(reply, ReplyError):
        raise reply
    return reply


def _micros(time_reply: Any) -> int:
    """TIME's reply (seconds, microseconds) in microseconds."""
    seconds, micros = time_reply
    return int(seconds) * 1_000_000 + int(micros)


def _check_text(field: str, text: str) -> None:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"$.{field}: not valid UTF-8 text ({exc.reason})",
                             {"path": f"$.{field}"}) from exc
