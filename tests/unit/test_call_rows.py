"""snapshot/calls.py: the unsaved records stored are exactly those whose change the
committed position has passed; the later ones wait for a later commit."""

from __future__ import annotations

from stateworker.snapshot.calls import _rows


def entry(n: int, revision: str) -> tuple[bytes, list[bytes]]:
    return (f"{n}-0".encode(),
            [b"f", b"F" * 12, b"v", b"digest00reply", b"r", revision.encode(), b"t", b"1000"])


def test_records_up_to_the_position_only() -> None:
    entries = [entry(1, "100-0"), entry(2, "100-1"), entry(3, "101-0"), entry(4, "102-5")]
    rows, done = _rows(entries, (101, 0))
    assert [r.revision for r in rows] == [(100, 0), (100, 1), (101, 0)]
    assert done == [b"1-0", b"2-0", b"3-0"]
    assert rows[0].field == b"F" * 12 and rows[0].value == b"digest00reply"
    assert rows[0].at_ms == 1000
    assert _rows(entries, (99, 9)) == ([], [])
