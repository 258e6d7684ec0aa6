"""The clock: every script gets the time as an argument (scripts never read it themselves),
so replicas agree on what a script saw."""

from __future__ import annotations

import datetime as dt
import functools
import time


def now_ms() -> int:
    """Epoch milliseconds now."""
    return time.time_ns() // 1_000_000


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


@functools.lru_cache(maxsize=8192)
def _second(epoch_s: int) -> str:
    """`2026-11-29T15:04:05`: formatting a time is most of a read's own cost in Python (a
    page of list-entries formats two or three per entry), and entries share their seconds."""
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
