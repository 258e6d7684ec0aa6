"""The clock: every script gets the time as an argument (scripts never read it themselves),
so replicas agree on what a script saw.

A process connected to the state's Redis runs on Redis's clock (`anchor`: its `TIME`, read
at connect and every CLOCK_SYNC_S after, state/lifecycle.py), carried between readings by
this machine's monotonic clock. Replicas whose own clocks disagree (NTP drift, a VM
resumed, a clock stepped back) then still agree on the time, within the readings' round
trips: the call records' time slices, expiry, leases and heartbeats compare one replica's
time with another's (decision 0004). A process never anchored (a CLI, a client alone) reads
its own wall clock.
"""

from __future__ import annotations

import datetime as dt
import functools
import time

CLOCK_SYNC_S = 1.0  # how often a service reads Redis's clock again (a stepped clock's bound)

_offset_ns: int | None = None  # Redis's clock minus the monotonic clock; None: not anchored
_error_ns = 0  # half the round trip of the reading `_offset_ns` came from


def now_ms() -> int:
    """Epoch milliseconds now: Redis's clock once anchored, else this machine's."""
    if _offset_ns is None:
        return time.time_ns() // 1_000_000
    return (time.monotonic_ns() + _offset_ns) // 1_000_000


def anchor(redis_time: list[bytes] | list[int], sent_ns: int, received_ns: int) -> bool:
    """Take a reading of Redis's clock (`TIME`'s reply: seconds, microseconds), asked at
    monotonic `sent_ns` and answered at `received_ns`; whether it was taken. A reading that
    agrees with the current anchor within both readings' uncertainty changes nothing (the
    time does not jitter by the round trip) unless it is more precise (a quicker round
    trip, as NTP keeps the reading of the least delay: a first reading slowed by a busy
    moment would otherwise leave its error for good); one that disagrees (either clock
    stepped, or the machine's monotonic clock stood still while it slept) moves it. However
    slow: a slow reading is still within half its round trip of Redis's clock, where this
    machine's own may be any distance off (decision 0070)."""
    global _offset_ns, _error_ns
    round_trip = received_ns - sent_ns
    if round_trip < 0:
        return False
    redis_ns = int(redis_time[0]) * 1_000_000_000 + int(redis_time[1]) * 1000
    offset, error = redis_ns - (sent_ns + round_trip // 2), round_trip // 2
    if _offset_ns is not None and abs(offset - _offset_ns) <= error + _error_ns + 1_000_000 \
            and 2 * error >= _error_ns:  # (only a reading twice as precise is worth a move)
        return False
    _offset_ns, _error_ns = offset, error
    return True


def rfc3339_ms(epoch_ms: int | None) -> str | None:
    """Epoch milliseconds -> `2026-11-29T15:04:05.123Z`."""
    if epoch_ms is None:
        return None
    return f"{_second(epoch_ms // 1000)}.{epoch_ms % 1000:03d}Z"


def epoch_ms(text: str) -> int:
    """`2026-11-29T15:04:05.123Z` (what `rfc3339_ms` writes) -> epoch milliseconds, exactly."""
    moment = dt.datetime.fromisoformat(text)
    return (moment - _EPOCH) // dt.timedelta(milliseconds=1)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def rfc3339_s(text: str) -> str:
    """`2026-11-29T15:04:05.123Z` (what `rfc3339_ms` writes) -> `2026-11-29T15:04:05Z`: to the
    second, cut rather than rounded, as Go's time.RFC3339 writes a time (Dapr's stores)."""
    return f"{_second(epoch_ms(text) // 1000)}Z"


@functools.lru_cache(maxsize=8192)
def _second(epoch_s: int) -> str:
    """`2026-11-29T15:04:05`: formatting a time is most of a read's own cost in Python (a
    page of list-entries formats two or three per entry), and entries share their seconds."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
