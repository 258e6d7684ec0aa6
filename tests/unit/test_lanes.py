"""bus/lanes.py: each caller's entries come out in the order they were read (held, parked
and fetched back), and free slots are shared among the callers with entries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stateworker.bus.lanes import Lanes
from stateworker.bus.sources import Source

SOURCE = Source("s", None)


def entry(caller: str, n: int) -> tuple[bytes, list[bytes]]:
    return (f"{n}-0".encode(), [b"id", f"{caller}{n}".encode(), b"caller", caller.encode()])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abc"), max_size=300), st.integers(1, 40), st.integers(1, 8),
       st.integers(1, 50), st.integers(1, 30), st.integers(1, 400))
def test_each_callers_entries_come_out_in_order_through_parking(
        callers: list[str], room: int, held: int, chunk: int, total: int,
        held_bytes: int) -> None:
    # Entries arrive `chunk` at a time between two takes, and a fetch of parked entries is
    # answered only after the next chunk arrived (as the runtime's XRANGE may be). The total
    # bounds (entries, bytes: an entry is about 20 bytes) park entries too.
    lanes = Lanes(held=held, total=total, held_bytes=held_bytes)
    arriving = [entry(c, n) for n, c in enumerate(callers)]
    out: list[bytes] = []
    asked: list[tuple[bytes, list[tuple[str, bytes]]]] = []
    while arriving or asked or lanes.held or lanes.parked:
        lanes.add(SOURCE, arriving[:chunk], set())
        del arriving[:chunk]
        for key, refs in asked:  # (the runtime's XRANGE: the fields as read)
            lanes.fetched(key, [(ref, entry(key.decode()[2:], int(ref[1].split(b"-")[0]))[1])
                                for ref in refs])
        assert lanes.held <= total and (lanes.held_bytes <= held_bytes or lanes.held == 1)
        taken = lanes.take(room)
        assert len(taken) <= room
        out += [e.ref[1] for e in taken]
        asked = lanes.to_fetch()
    assert sorted(out) == sorted(f"{n}-0".encode() for n in range(len(callers)))
    for caller in "abc":
        mine = [r for r in out if callers[int(r.split(b"-")[0])] == caller]
        assert mine == sorted(mine, key=lambda r: int(r.split(b"-")[0]))
    assert not lanes.lanes and lanes.held == lanes.parked == lanes.held_bytes == 0


def test_a_slot_goes_to_each_caller_in_turn_whatever_came_first() -> None:
    lanes = Lanes(held=256)
    lanes.add(SOURCE, [entry("flood", n) for n in range(10_000)], set())
    lanes.add(SOURCE, [entry("probe", 10_000)], set())
    assert lanes.held == 256 + 1 and lanes.parked == 10_000 - 256
    first = lanes.take(2)
    assert [e.flat[3] for e in first if e.flat] == [b"flood", b"probe"]


def test_distinct_callers_park_past_the_total_bounds() -> None:
    """A lane each (the entry names its caller): the total bounds memory, not the lanes."""
    lanes = Lanes(held=256, total=100, held_bytes=10**9)
    lanes.add(SOURCE, [entry(f"c{n}", n) for n in range(300)], set())
    assert (lanes.held, lanes.parked) == (100, 200)
    size = len(b"".join(entry("c0", 0)[1]))
    lanes = Lanes(held=256, total=10**6, held_bytes=50 * size)
    lanes.add(SOURCE, [(f"{n}-0".encode(), entry("c0", n % 10)[1]) for n in range(300)], set())
    assert lanes.held == 50 and lanes.held_bytes <= 50 * size and lanes.parked == 250


def test_an_entry_read_again_is_filed_once_and_known_until_taken() -> None:
    """The pending history read again brings entries the lanes hold: filed once, so served
    once; `refs` names each entry in a lane (held or parked) until it is taken, so the
    runtime's own reclaim leaves it to its lane."""
    lanes = Lanes(held=2, total=100, held_bytes=10**9)
    first = [entry("a", n) for n in range(4)]  # two held, two parked
    lanes.add(SOURCE, first, set())
    lanes.add(SOURCE, first, set())
    assert (lanes.held, lanes.parked) == (2, 2)
    assert lanes.refs == {("s", f"{n}-0".encode()) for n in range(4)}
    taken = lanes.take(10)
    assert [e.ref for e in taken] == [("s", b"0-0"), ("s", b"1-0")]
    assert lanes.refs == {("s", b"2-0"), ("s", b"3-0")}
