"""The byte bound's setting and its ledger (reactive/event_bytes.py): where the trim cuts a
stream known only as what each round added."""

from __future__ import annotations

import pytest

from stateworker.errors import ConfigError
from stateworker.reactive.event_bytes import Ledger
from stateworker.settings import Settings

MIB = 1024 * 1024


def test_events_max_bytes_is_read_from_the_environment_and_checked_naming_its_limits() -> None:
    assert Settings().events_max_bytes == 64 * MIB
    env = {"STATEWORKER_EVENTS_MAX_BYTES": str(8 * MIB)}
    assert Settings.from_env(env).events_max_bytes == 8 * MIB
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"STATEWORKER_EVENTS_MAX_BYTES": str(MIB)})
    message = str(caught.value)  # (a ConfigError stops the start: its class is its code)
    assert "events_max_bytes (STATEWORKER_EVENTS_MAX_BYTES)" in message
    assert f"at least twice max_value_bytes ({2 * MIB}" in message and f"got {MIB}" in message
    with pytest.raises(ConfigError, match=r"at most 1099511627776 \(1 TiB\), got 1099511627777"):
        Settings(events_max_bytes=(1 << 40) + 1)


def rounds(ledger: Ledger, *added: tuple[int, int]) -> int:
    """Measurements of a stream nothing trims, one a round: (its last id's ms, bytes added)."""
    size = 0
    for ms, grown in added:
        size += grown
        ledger.measured((1, 0), (ms, 0), size)
    return size


def test_the_oldest_rounds_go_whole_and_the_one_the_bound_falls_in_by_its_time_span() -> None:
    ledger = Ledger()
    size = rounds(ledger, (10, 4 * MIB), (20, 4 * MIB), (40, 4 * MIB))  # ms 1-10, 11-20, 21-40
    # 12 MiB, 4 over: the first round goes whole, up to just after its last id.
    assert ledger.cut(size, 8 * MIB, (99, 0)) == (10, 1)
    assert [c.size for c in ledger.chunks] == [4 * MIB, 4 * MIB]
    ledger.measured((11, 0), (40, 0), 8 * MIB)
    # 2 MiB over: half of the next round's span (its 10 ms from 11 on), not all of it.
    assert ledger.cut(8 * MIB, 6 * MIB, (99, 0)) == (16, 0)


def test_nothing_at_or_after_the_fence_goes() -> None:
    ledger = Ledger()
    size = rounds(ledger, (10, 4 * MIB), (20, 4 * MIB), (40, 4 * MIB))
    assert ledger.cut(size, 2 * MIB, (15, 3)) == (15, 3)  # (MINID: the events before it)
    ledger = Ledger()
    size = rounds(ledger, (10, 4 * MIB))
    assert ledger.cut(size, 2 * MIB, (1, 0)) is None  # nothing handed on is kept


def test_a_measurement_after_another_trim_takes_what_went_from_the_oldest() -> None:
    ledger = Ledger()
    rounds(ledger, (10, 4 * MIB), (20, 4 * MIB))
    # The retention window took 3 MiB from inside the first round; nothing was added since.
    ledger.measured((5, 0), (20, 0), 5 * MIB)
    assert [(c.end, c.size) for c in ledger.chunks] == [((10, 0), MIB), ((20, 0), 4 * MIB)]
    # 2 MiB added: a round of its own (the chunks always add up to what was measured).
    ledger.measured((5, 0), (30, 0), 7 * MIB)
    assert [(c.end, c.size) for c in ledger.chunks] == [
        ((10, 0), MIB), ((20, 0), 4 * MIB), ((30, 0), 2 * MIB)]
    ledger.measured((25, 0), (30, 0), MIB)  # all but the last round gone, and part of it
    assert [(c.end, c.size) for c in ledger.chunks] == [((30, 0), MIB)]
    ledger.measured(None, (30, 0), 0)  # empty
    assert ledger.chunks == []
