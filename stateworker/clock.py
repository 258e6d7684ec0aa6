"""The clock: every script gets the time as an argument (scripts never read it themselves),
so replicas agree on what a script saw."""

from __future__ import annotations

import datetime as dt
import time


def now_ms() -> int:
    """Epoch milliseconds now."""
    return time.time_ns() // 1_000_000


def rfc3339_ms(epoch_ms: int | None) -> str | None:
    """Epoch milliseconds -> `2026-11-29T15:04:05.123Z`."""
    if epoch_ms is None:
        return None
    moment = dt.datetime.fromtimestamp(epoch_ms // 1000, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{epoch_ms % 1000:03d}Z"
