"""The reads of a `Watch` (events/watch.py): where each partition's cursor starts, the reads
from the cursors (each with the checks that nothing after a cursor was lost), the wait for
something new, and Redis's errors: the transient ones waited out, the others raised.

One read is one transaction (MULTI ... EXEC): `XINFO STREAM` of each partition read, its
history record, an `XRANGE` of the entry at its cursor, one `XREAD COUNT <page>` of them all,
`TIME`. Being atomic, the XINFO tells exactly whether events after the cursor were trimmed
before this read (`compaction.lost_after`), the history record whether the cursor is from
before a restore or a new Redis, or ahead of this Redis, and the XINFO's count with the entry
at the cursor whether Redis went back to an older copy since the watch read it
(`compaction.gap`). When a read finds nothing, the watch waits with `XREAD
BLOCK` on every partition it reads (its reply only says "something came"; the transaction reads
it), at most until the next bookmark is due. On one server (not a cluster) the wait and the
read go in one pipeline: Redis runs the transaction as soon as the wait ends, so an event
reaches the watch in one round trip, not two. A transient Redis error (broken connection,
LOADING ...) is waited out with `Backoff` and the read repeated from the same cursors: cursors
move only with a read's reply, so nothing is lost or repeated across reconnects.

On a Redis Cluster an unscoped watch's partitions are in several slots, and Redis refuses an
XREAD or a MULTI across slots (even on one node). There each partition is read in a transaction
of its own (its XINFO, history, XREAD and its primary's TIME), all sent at once (one pipeline
per primary: as many round trips as one server's single read, in parallel), and the wait is
transport/streamread.py's (one blocking XREAD per slot, the first answer ends the others). The
single-server read is unchanged: one transaction, one round trip.

`WatchReads` is a mixin of `Watch`, which holds the state it uses (declared below for the type
checker).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio

from stateworker.errors import Unavailable
from stateworker.events.compaction import history_of, stream_info
from stateworker.events.model import Revision, revision_text
from stateworker.events.reader import PartitionReader
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.retry import Backoff, transient_reason
from stateworker.transport.slot_transactions import transactions_by_slot
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

# One partition's read: the partition, its XINFO STREAM and history replies, the entries read,
# the clock (µs) of the Redis that holds it, whether the stream holds an entry at the cursor,
# all from one transaction.
PartitionRead = tuple["Partition", Any, Any, list[Any], int, bool]


class Partition:
    """One partition as the watch reads it."""

    __slots__ = ("at_entry", "counted", "cursor", "frontier", "held", "history", "index", "more",
                 "number", "reader")

    def __init__(self, reader: PartitionReader, history: str, number: int, index: int,
                 cursor: Revision, counted: int | None) -> None:
        self.reader = reader
        self.history = history  # its history key (compaction.History)
        self.number = number  # the partition's number in the key space
        self.index = index  # its place in the watch's list (the merge refers to it)
        self.cursor = cursor  # the last stream id examined
        self.counted = counted  # entries ever added up to the cursor (compaction.py); None: unknown
        # The cursor is an entry this watch read: the stream holds it until a trim from the
        # front or an XDEL takes it (compaction.gap).
        self.at_entry = False
        self.held = 0  # its entries read but waiting in the merge for other partitions
        self.more = True  # it may hold entries after the cursor that no read has brought yet
        self.frontier = cursor  # every entry of it up to here has been read


class WatchReads:
    """A watch's reads from Redis and its waits (module docstring)."""

    url: str
    conn: RedisConnection
    page: int
    transient: Counter[str]
    position: Revision
    _parts: list[Partition]
    _waits: StreamReader | None  # an unscoped watch on a Redis Cluster: its blocking reads

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

    async def _read_together(self, parts: list[Partition], wait_s: float = 0.0
                             ) -> list[PartitionRead]:
        """One transaction: each partition's XINFO and history, one XREAD of them all, TIME;
        with `wait_s`, sent behind a blocking XREAD of the same cursors, so that Redis runs it
        once an entry comes or the time is up (the wait's own reply is dropped)."""
        streams, cursors = self._cursors(parts)
        count = len(parts)
        commands: list[list[Arg]] = [["XINFO", "STREAM", s] for s in streams]
        commands += [["HMGET", p.history, "after", "cause"] for p in parts]
        commands += [["XRANGE", s, c, c] for s, c in zip(streams, cursors, strict=True)]
        commands += [["XREAD", "COUNT", self.page, "STREAMS", *streams, *cursors], ["TIME"]]
        wait: list[Arg] | None = None
        if wait_s > 0:
            wait = ["XREAD", "COUNT", 1, "BLOCK", max(int(wait_s * 1000), 1),
                    "STREAMS", *streams, *cursors]
        replies = await self._transaction(commands, wait)
        read = {name.decode(): entries for name, entries in checked(replies[-2]) or []}
        clock_us = micros(checked(replies[-1]))
        return [(part, reply, recorded, read.get(part.reader.stream, []), clock_us,
                 bool(checked(at_cursor)))
                for part, reply, recorded, at_cursor in zip(
                    parts, replies[:count], replies[count:2 * count],
                    replies[2 * count:3 * count], strict=True)]

    async def _read_each(self, parts: list[Partition]) -> list[PartitionRead]:
        """On a Redis Cluster: one transaction per partition (one slot), all sent at once (one
        pipeline per primary): its XINFO, history, entry at the cursor, XREAD and its
        primary's TIME."""
        replies = await self._transactions([
            [["XINFO", "STREAM", p.reader.stream], ["HMGET", p.history, "after", "cause"],
             ["XRANGE", p.reader.stream, revision_text(p.cursor), revision_text(p.cursor)],
             ["XREAD", "COUNT", self.page, "STREAMS", p.reader.stream, revision_text(p.cursor)],
             ["TIME"]] for p in parts], [p.reader.stream for p in parts])
        reads: list[PartitionRead] = []
        for part, (reply, recorded, at_cursor, read, clock) in zip(parts, replies, strict=True):
            entries = checked(read)[0][1] if checked(read) else []
            reads.append((part, reply, recorded, entries, micros(checked(clock)),
                          bool(checked(at_cursor))))
        return reads

    @staticmethod
    def _cursors(parts: list[Partition]) -> tuple[list[str], list[str]]:
        return [p.reader.stream for p in parts], [revision_text(p.cursor) for p in parts]

    def _met(self, error: BaseException) -> None:
        self.transient[transient_reason(error) or str(error).split(" ", 1)[0] or "OTHER"] += 1

    async def _transaction(self, commands: list[list[Arg]], wait: list[Arg] | None = None
                           ) -> list[Any]:
        """The replies of `commands` run as one MULTI ... EXEC (behind `wait`: `_execute`)."""
        replies = await self._execute([["MULTI"], *commands, ["EXEC"]], wait)
        return list(checked(replies[-1]))

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

    async def _execute(self, commands: list[list[Arg]], wait: list[Arg] | None = None
                       ) -> list[Any]:
        """Run commands (they only read), the first time behind `wait` (a blocking read whose
        reply is dropped); a transient failure is waited out with backoff and they run again
        (without the wait: it is over), for as long as it takes: a watch rides out Redis
        restarts."""
        backoff = Backoff()
        lead = [] if wait is None else [wait]
        while True:
            try:
                replies = await self._sent(lead + commands, blocking=bool(lead))
                for reply in replies:
                    checked(reply)
                return replies[len(lead):]
            except (ConnectionLost, ReplyError) as exc:
                self._refused(exc)
                self._met(exc)
                if lead:  # the wait ended early: read at once
                    lead = []
                    continue
                await anyio.sleep(backoff.next())

    async def _sent(self, commands: list[list[Arg]], blocking: bool) -> list[Any]:
        try:
            return await self.conn.pipeline(commands)
        except anyio.get_cancelled_exc_class():
            # A blocking XREAD stays blocked in Redis: a read after it would queue behind it.
            if blocking:
                with anyio.CancelScope(shield=True):
                    await self.conn.close()
            raise

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


def checked(reply: Any) -> Any:
    if isinstance(reply, ReplyError):
        raise reply
    return reply


def micros(time_reply: Any) -> int:
    """TIME's reply (seconds, microseconds) in microseconds."""
    seconds, micros = time_reply
    return int(seconds) * 1_000_000 + int(micros)
