"""Counters of one service: calls, errors by code, latency. Kept in process, added to the
Redis hash `<prefix>:stats:<service>` with the reply writes (at most once a second), so
`stateworker status` of any process can show them."""

from __future__ import annotations

import time
from collections import Counter

from stateworker.redisconn import Arg

# Latency buckets (upper bounds in ms) of the `latency_le_<ms>` counters.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
FLUSH_EVERY_S = 1.0


class Stats:
    def __init__(self) -> None:
        self.pending: Counter[str] = Counter()
        self.last_flush = time.monotonic()

    def count(self, error_code: str | None, started: float | None) -> None:
        self.pending["calls"] += 1
        if error_code is not None:
            self.pending[f"errors:{error_code}"] += 1
        if started is not None:
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.pending["latency_us_sum"] += int(elapsed_ms * 1000)
            for bound in LATENCY_BUCKETS_MS:
                if elapsed_ms <= bound:
                    self.pending[f"latency_le_{bound}ms"] += 1
                    break
            else:
                self.pending["latency_gt_5000ms"] += 1

    def flush_commands(self, key: str, force: bool = False) -> list[list[Arg]]:
        """HINCRBY commands for what was counted since the last flush (at most once a second
        unless forced)."""
        now = time.monotonic()
        if not self.pending or (now - self.last_flush < FLUSH_EVERY_S and not force):
            return []
        self.last_flush = now
        commands: list[list[Arg]] = [["HINCRBY", key, name, value]
                                     for name, value in self.pending.items()]
        self.pending.clear()
        return commands
