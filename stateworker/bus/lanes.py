"""Fair shares of a shared call stream: the entries a `BusRuntime` has read, in one lane per
caller, served round-robin.

A stream is one queue: a caller who floods it with 100,000 calls puts them all ahead of
everyone else's next call. So while a backlog waits the runtime reads ahead and files each
entry in its caller's lane: the principal of an `acl` mode stream, else the entry's `caller`
field, else its reply list (one per client), else "" (fire-and-forget calls, triggers'). A
lane holds at most `HELD` entries in memory; the rest of a flooding caller's entries are
parked: read (so pending for this consumer, never lost: a restart reads its own pending
entries again, a dead consumer's are taken over after the visibility timeout) but kept as ids
only, and fetched again (`XRANGE id id`) when the lane is down to half; entries read while a
fetch is under way park behind it, so one caller's calls keep their order. Free call slots go
to the lanes in turn, so another caller's call waits for about one batch, not for the flood.

Bounds: `HELD` entries per lane in memory, and `TOTAL_HELD` entries and `HELD_BYTES` bytes
of fields in memory across the lanes (a lane is named by the entry's own fields, so a flood
naming a new caller in each entry makes as many lanes: the total bounds what they hold);
beyond, entries park as a flooding lane's do, and are fetched back as memory frees. `PARKED`
ids in all; at that, the runtime stops reading until the lanes drain (the stream holds the
rest, as before).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from stateworker.bus.protocol import Ref
from stateworker.bus.sources import Source

HELD = 256  # entries of one lane in memory, at most; beyond, its entries are parked
TOTAL_HELD = 4096  # entries of every lane in memory, at most; beyond, entries are parked
HELD_BYTES = 64 * 1024 * 1024  # bytes of fields of every lane in memory, at most (but one)
PARKED = 200_000  # parked entries (ids) of every lane, at most; then reading waits
_CALLER, _REPLY = b"caller", b"reply"


class Entry(NamedTuple):
    """An entry read: where it is, its fields (flat, as read), whose stream."""

    ref: Ref
    flat: list[bytes] | None  # None: deleted while pending (acknowledged, not run)
    source: Source
    size: int = 0  # its fields' bytes, while a lane holds it (`Lanes.held_bytes`)


class Lane:
    """One caller's entries: those in memory (in order), then those parked (ids, in order)."""

    __slots__ = ("fetching", "held", "parked", "sources")

    def __init__(self) -> None:
        self.held: deque[Entry] = deque()
        self.parked: deque[Ref] = deque()
        self.fetching = 0  # parked entries being read back: what comes meanwhile parks
        self.sources: dict[str, Source] = {}  # stream -> its source (for parked refs)


def lane_of(flat: list[bytes], source: Source) -> bytes:
    """Whose entry it is: the stream's principal, else its `caller`, else its reply list."""
    if source.principal is not None:
        return source.principal.encode()
    reply = b""
    for i in range(0, len(flat) - 1, 2):
        name = flat[i]
        if name == _CALLER:
            return b"c:" + flat[i + 1]
        if name == _REPLY:
            reply = flat[i + 1]
    return b"r:" + reply


class Lanes:
    """The lanes of one runtime, and the order in which they are served."""

    def __init__(self, held: int = HELD, parked: int = PARKED, total: int = TOTAL_HELD,
                 held_bytes: int = HELD_BYTES) -> None:
        self.held_max = held
        self.parked_max = parked
        self.total_max = total
        self.bytes_max = held_bytes
        self.lanes: dict[bytes, Lane] = {}
        self.turns: deque[bytes] = deque()  # lanes with entries in memory, in serving order
        self.held = 0  # entries in memory, every lane's
        self.held_bytes = 0  # their fields' bytes
        self.parked = 0  # parked ids, every lane's
        self.fetching = 0  # parked entries being read back, every lane's
        # Every entry in a lane (held, parked or being read back), until taken: pending to
        # this runtime, so its own reclaim must not serve it too (runtime.py `_spawn`).
        self.refs: set[Ref] = set()
        self._full = False  # an entry read back did not fit memory: fetch after a take

    def _fits(self, size: int) -> bool:
        """Whether an entry of `size` bytes may be held in memory (one always may, alone)."""
        return not self.held or (self.held < self.total_max
                                 and self.held_bytes + size <= self.bytes_max)

    @property
    def accepting(self) -> bool:
        """Whether more may be read (the parked ids are below their bound)."""
        return self.parked < self.parked_max

    def add(self, source: Source, entries: list[Any], skip: set[Ref]) -> None:
        """File entries read from `source` (XREADGROUP's `(id, fields)`; fields None: deleted
        while pending, kept in memory so that it is acknowledged); those in `skip` (being
        served: a pending history read again) are left out."""
        for entry_id, flat in entries:
            if (source.stream, entry_id) in skip:
                continue
            key = lane_of(flat or [], source)
            lane = self.lanes.get(key)
            if lane is None:
                lane = self.lanes[key] = Lane()
            ref = (source.stream, entry_id)
            if ref in self.refs:  # (read again with the pending history: filed already)
                continue
            self.refs.add(ref)
            size = _size(flat)
            if (lane.parked or lane.fetching or len(lane.held) >= self.held_max
                    or not self._fits(size)):
                lane.parked.append(ref)
                lane.sources[source.stream] = source
                self.parked += 1
                continue
            if not lane.held:
                self.turns.append(key)
            lane.held.append(Entry(ref, flat, source, size))
            self.held += 1
            self.held_bytes += size

    def take(self, room: int) -> list[Entry]:
        """Up to `room` entries, the lanes in turn: each gives an equal share (at least one),
        then goes to the back of the turns if it has more."""
        taken: list[Entry] = []
        while room > len(taken) and self.turns:
            share = max(1, (room - len(taken)) // len(self.turns))
            for _ in range(len(self.turns)):
                if len(taken) >= room:
                    break
                key = self.turns.popleft()
                lane = self.lanes[key]
                for _ in range(min(share, room - len(taken), len(lane.held))):
                    taken.append(lane.held.popleft())
                if lane.held:
                    self.turns.append(key)
                elif not lane.parked and not lane.fetching:
                    del self.lanes[key]
        self.held -= len(taken)
        self.held_bytes -= sum(entry.size for entry in taken)
        self.refs.difference_update(entry.ref for entry in taken)
        if taken:
            self._full = False
        return taken

    def to_fetch(self) -> list[tuple[bytes, list[Ref]]]:
        """The parked ids to read back now: of each lane down to half its memory (and not
        being read back already), enough to fill it (taken off the parked ones), while the
        lanes' total is below its bounds (entries; bytes: down to half)."""
        wanted: list[tuple[bytes, list[Ref]]] = []
        low = self.held_max // 2
        room = self.total_max - self.held - self.fetching
        if self._full or self.held_bytes > self.bytes_max // 2:
            return wanted
        for key, lane in self.lanes.items():
            if room <= 0:
                break
            if lane.parked and not lane.fetching and len(lane.held) <= low:
                count = min(self.held_max - len(lane.held), len(lane.parked), room)
                room -= count
                self.fetching += count
                refs = [lane.parked.popleft() for _ in range(count)]
                self.parked -= count
                lane.fetching = count
                wanted.append((key, refs))
        return wanted

    def fetched(self, key: bytes, entries: list[tuple[Ref, list[bytes] | None]]) -> None:
        """Parked entries read back (fields None: gone from the stream meanwhile), after
        their lane's memory, in order (what was read meanwhile is parked after them)."""
        lane = self.lanes[key]
        self.fetching -= lane.fetching
        lane.fetching = 0
        for kept, (ref, flat) in enumerate(entries):
            size = _size(flat)
            if not self._fits(size):  # (memory filled meanwhile: the rest park again, first)
                back = [ref for ref, _ in entries[kept:]]
                lane.parked.extendleft(reversed(back))
                self.parked += len(back)
                self._full = True
                break
            if not lane.held:
                self.turns.append(key)
            lane.held.append(Entry(ref, flat, lane.sources.get(ref[0]) or Source(ref[0], None),
                                   size))
            self.held += 1
            self.held_bytes += size
        if not lane.held and not lane.parked:
            del self.lanes[key]


def _size(flat: list[bytes] | None) -> int:
    """An entry's fields' bytes (what holding it costs, near enough)."""
    return sum(len(field) for field in flat) if flat else 0
