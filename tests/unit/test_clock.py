"""clock.anchor: which readings of Redis's `TIME` the process takes, from readings made up
here (monotonic send and receive times around a reply), so each rule is seen alone."""

from __future__ import annotations

import time

import pytest

from stateworker import clock

MS = 1_000_000
TRUE_OFFSET = 1_765_000_000_000 * MS  # Redis's clock minus this machine's monotonic clock


@pytest.fixture(autouse=True)
def unanchored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_offset_ns", None)
    monkeypatch.setattr(clock, "_error_ns", 0)


def reading(round_trip_ns: int, answered_at: float, offset: int = TRUE_OFFSET
            ) -> tuple[list[int], int, int]:
    """A TIME reply asked a moment ago, taking `round_trip_ns`, Redis reading its clock at
    `answered_at` of the way (0: as the request left, 1: as the reply came)."""
    sent = time.monotonic_ns() - round_trip_ns
    redis_ns = sent + int(round_trip_ns * answered_at) + offset
    return [redis_ns // 1_000_000_000, redis_ns % 1_000_000_000 // 1000], sent, sent + round_trip_ns


def off_by_ms(offset: int = TRUE_OFFSET) -> float:
    """How far the process's time is from Redis's, in ms."""
    truth = (time.monotonic_ns() + offset) / MS
    return abs(clock.now_ms() - truth)


def test_a_reading_anchors_the_time_to_redis() -> None:
    assert clock.anchor(*reading(200_000, 0.5))
    assert off_by_ms() <= 1


def test_a_process_whose_every_reading_is_slow_runs_on_redis_clock() -> None:
    """A process that reaches Redis over a slow link (every TIME round trip 80 ms: another
    region) runs on Redis's clock within half a round trip, follows it when it steps, and
    does not jitter. Before, no reading slower than 50 ms was taken: such a process ran on
    its own clock for good (a worker ahead by more than a call's timeout refused every call
    as past its deadline; decision 0070)."""
    slow = 80 * MS
    assert clock.anchor(*reading(slow, 0.5))
    assert off_by_ms() <= 1
    assert not clock.anchor(*reading(slow, 0.0))  # (within the errors: no jitter)
    assert not clock.anchor(*reading(slow, 1.0))
    stepped = TRUE_OFFSET + 40_000 * MS  # (Redis's host clock stepped 40 s)
    assert clock.anchor(*reading(slow, 0.5, stepped))
    assert off_by_ms(stepped) <= 1


def test_a_slow_first_reading_is_bettered_by_a_quick_one() -> None:
    """A reading whose round trip was 40 ms can be 20 ms off (Redis read its clock as the
    reply left); a later quick reading agrees with it within that, and must replace it: else
    the process keeps the 20 ms for good (replicas would differ by it: decision 0004)."""
    assert clock.anchor(*reading(40 * MS, 1.0))
    assert 19 <= off_by_ms() <= 21
    assert clock.anchor(*reading(200_000, 0.5))
    assert off_by_ms() <= 1


def test_a_reading_no_better_than_the_anchor_changes_nothing() -> None:
    """Readings that agree within their uncertainty, and are not more precise, leave the
    anchor: the time does not jitter with each round trip."""
    assert clock.anchor(*reading(2 * MS, 0.5))
    assert not clock.anchor(*reading(2 * MS, 0.9))
    assert not clock.anchor(*reading(3 * MS, 0.1))


def test_a_stepped_clock_moves_the_anchor() -> None:
    assert clock.anchor(*reading(200_000, 0.5))
    stepped = TRUE_OFFSET + 40_000 * MS  # (Redis's host clock stepped 40 s)
    assert clock.anchor(*reading(200_000, 0.5, stepped))
    assert off_by_ms(stepped) <= 1
