"""The byte bound of each partition's event history (`events_max_bytes`), kept by the trimmer.

Why: an event carries the old and the new value (up to `max_value_bytes` each), so the count
cap alone (`events_maxlen`) lets one caller writing large values to one scope grow one
partition's stream to ~100,000 x 2 MiB, kept an hour for watches: Redis runs out of memory and
every caller is refused.

How, off the write path (the entry scripts pay nothing): once a round the lease holder
measures each stream it holds exactly, `MEMORY USAGE <stream> SAMPLES 0` (the allocated size
of every node), in one MULTI with `XINFO STREAM` (its last id and oldest kept). A sampled
measure is no bound: Redis samples the OLDEST nodes, so a stream of small events followed by
large ones measures a fraction of its size (400 events of 512 KiB after 10 without an old
value: 251 MiB sampled, 494 MiB in fact). The walk costs about 5 ms per 100,000 nodes (an
event over 4 KiB is a node of its own), so within the bound it is about 1 ms. A stream whose
trimmable part is empty (nothing handed on is kept) is not measured at all.

Where to cut without reading a value (a Lua walk that sizes events copies them, 2.7 ms a MiB
inside Redis, as much again as writing them; a byte counter in the write scripts would cost
every write): the `Ledger` keeps the stream as chunks, what each round
added (its end: the last id then; its bytes: what the stream grew by). Over the bound, the
oldest chunks go by an exact `XTRIM MINID` just after a chunk's end, never at or past the
`fence` (the oldest event still owed: not yet handed on by the dispatcher, or not yet in the
snapshot): owed events are never dropped for bytes, they stay bounded by the count cap alone.
What other trims take from inside a chunk (the retention window, the cap) is reconciled at the
next measurement: the chunks always add up to the measured size, the oldest shrunk first.
The chunk the bound falls in is cut by its share of the chunk's time span (ids are times), its
events' sizes being unknown one by one; the next measurement corrects either way. So a stream
is held to the bound within a round or two. A new lease holder knows the stream as one chunk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from stateworker.events.model import MAX_SEQ, Revision, revision_of, revision_text

log = logging.getLogger("stateworker.reactive.trimming")

MAX_CHUNKS = 256  # a ledger's chunks at most: beyond, the two smallest neighbours merge


@dataclass(slots=True)
class Chunk:
    """The events after the previous chunk's end up to `end`, and their bytes."""

    end: Revision
    size: int


@dataclass(slots=True)
class Ledger:
    """One partition's stream as chunks, oldest first (module docstring)."""

    chunks: list[Chunk] = field(default_factory=list)
    first: Revision | None = None  # the oldest kept at the last measurement (None: unknown)
    over: bool = False  # over the bound after the last trim (logged when it changes)

    def measured(self, first: Revision | None, last: Revision, size: int) -> None:
        """Reconcile with a measurement: the stream's oldest kept entry (None: empty), its
        last id and its size. Chunks wholly trimmed go; what the kept chunks claim beyond
        `size` comes off the oldest (another trim took from inside them); the rest of `size`
        is what was added since, a new chunk up to `last`."""
        self.first = first
        if first is None:
            self.chunks.clear()
            return
        self.chunks = [c for c in self.chunks if c.end >= first]
        excess = sum(c.size for c in self.chunks) - size
        for chunk in self.chunks:
            if excess <= 0:
                break
            taken = min(chunk.size, excess)
            chunk.size -= taken
            excess -= taken
        added = max(0, -excess)
        if self.chunks and self.chunks[-1].end >= last:
            self.chunks[-1].size += added
        else:
            self.chunks.append(Chunk(last, added))
        if len(self.chunks) > MAX_CHUNKS:
            self._merge()

    def trimmable(self, fence: Revision) -> bool:
        """Whether the stream may hold events before `fence` (so it is measured): unknown
        yet, or its oldest kept was before it."""
        return self.first is None or fence > self.first

    def cut(self, size: int, bound: int, fence: Revision) -> Revision | None:
        """Where to trim (`XTRIM MINID`: the events before it go) for the stream to hold at
        most `bound` bytes, the oldest chunks first, never past `fence` (the events at and
        after it are owed); None: nothing to trim. The chunks that go are dropped; of one
        that must go only in part, the share of its time span that the bytes ask for (its
        events' sizes are not known one by one: the next measurement tells what went)."""
        at: Revision | None = None
        start = self.first
        while size > bound and self.chunks and start is not None:
            oldest = self.chunks[0]
            need = size - bound
            if need < oldest.size and oldest.end[0] > start[0]:
                span = oldest.end[0] - start[0] + 1
                ms = start[0] + min(span, -(-span * need // oldest.size))  # (rounded up)
                part: Revision = min((ms, 0), fence)
                if part > start:
                    at = part
                    oldest.size -= oldest.size * (part[0] - start[0]) // span
                break
            after = _after(oldest.end)
            if after > fence:  # owed events in the chunk: what is before them goes
                if fence > start:
                    at = fence
                break
            at = start = after
            size -= oldest.size
            self.chunks.pop(0)
        return at

    def _merge(self) -> None:
        """Two neighbours into one where they hold the least: the cut stays fine where the
        bytes are."""
        pairs = range(len(self.chunks) - 1)
        i = min(pairs, key=lambda j: self.chunks[j].size + self.chunks[j + 1].size)
        self.chunks[i + 1].size += self.chunks[i].size
        del self.chunks[i]


def _after(revision: Revision) -> Revision:
    """The smallest stream id after `revision`."""
    ms, seq = revision
    return (ms, seq + 1) if seq < MAX_SEQ else (ms + 1, 0)


def measure_commands(events: str, measured: bool) -> list[list[Any]]:
    """One partition's MULTI: `XINFO STREAM`, and its `MEMORY USAGE` when `measured`."""
    size = [["MEMORY", "USAGE", events, "SAMPLES", 0]] if measured else []
    return [["MULTI"], ["XINFO", "STREAM", events], *size, ["EXEC"]]


def measure_replies(replies: list[Any], measured: bool) -> tuple[Any, int | None]:
    """`measure_commands`'s replies: XINFO STREAM's reply (an error when the stream does not
    exist) and the stream's size in bytes (None: not measured, or no stream)."""
    done = replies[-1]
    if not isinstance(done, list):  # (EXEC refused: the XINFO's error tells why)
        return done, None
    size = done[1] if measured else None
    return done[0], None if size is None else int(size)


def bytes_cut(ledger: Ledger, partition: int, info: Any, size: int | None, bound: int,
              fence: Revision) -> Revision | None:
    """Reconcile `ledger` with a measurement (`info`: trimming.StreamInfo) and say where the
    byte bound trims (None: nowhere); a change of state (over the bound, or owed events
    alone over it) is logged once."""
    if size is None:
        return None
    first = revision_of(info.first_id) if info.length else None
    ledger.measured(first, revision_of(info.last_id), size)
    at = ledger.cut(size, bound, fence)
    left = sum(c.size for c in ledger.chunks)
    over = left > bound
    if over != ledger.over:
        ledger.over = over
        if over:
            log.warning("partition %d: events owed to triggers or the snapshot hold about %d "
                        "bytes, over events_max_bytes (%d); they are kept until handed on "
                        "(bounded by events_maxlen)", partition, left, bound,
                        extra={"event": "dispatch.events_bytes_owed", "partition": partition,
                               "bytes": left, "fence": revision_text(fence)})
    if at is not None:
        log.debug("partition %d: %d bytes of events, over events_max_bytes (%d): trimmed "
                  "below %s", partition, size, bound, revision_text(at),
                  extra={"event": "dispatch.events_bytes_trim", "partition": partition})
    return at
