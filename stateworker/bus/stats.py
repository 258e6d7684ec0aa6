"""Counters of one service: calls, errors by code, latency. Kept in process, added to the
Redis hash `<prefix>:stats:<service>` with the reply writes (at most every FLUSH_EVERY_S), so
`stateworker status` of any process can show them."""

from __future__ import annotations

import bisect
import time
from collections import Counter

from stateworker.clock import now_ms
from stateworker.transport.wire import Arg

# Latency buckets (upper bounds in ms) of the `latency_le_<ms>` counters.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
FLUSH_EVERY_S = 0.25  # counters reach Redis at most this late (status reads them there)


_BUCKET_NAMES = [f"latency_le_{bound}ms" for bound in LATENCY_BUCKETS_MS] + ["latency_gt_5000ms"]


UNKNOWN_FUNCTION_LABEL = "(unknown)"


def function_label(fn: str, code: str | None) -> str:
    """A call's function as a counter's label: a name no function has is one label for all
    (callers choose the names: one label each would grow without limit)."""
    return UNKNOWN_FUNCTION_LABEL if code == "UNKNOWN_FUNCTION" else fn


class Stats:
    """Counts on the hot path are plain integers; names are made once a second."""

    def __init__(self) -> None:
        self.pending: Counter[str] = Counter()
        self.calls = 0
        self.total = 0  # calls this runtime answered since it started (the hash sums replicas)
        self.latency_us = 0
        self.buckets = [0] * len(_BUCKET_NAMES)
        self.last_flush = time.monotonic()
        # Since start, for /metrics (app/metrics.py): calls by (function, code: "OK" for a
        # success), and the latency buckets and sum less what `buckets` holds still.
        self.by_function: Counter[tuple[str, str]] = Counter()
        self.seen_buckets = [0] * len(_BUCKET_NAMES)
        self.seen_latency_us = 0

    def count(self, error_code: str | None, started: float | None, fn: str | None = None
              ) -> None:
        self.calls += 1
        self.total += 1
        self.by_function[(function_label(fn or "", error_code), error_code or "OK")] += 1
        if error_code is not None:
            self.pending[f"errors:{error_code}"] += 1
        if started is not None:
            elapsed_ms = (time.perf_counter() - started) * 1000
            self.latency_us += int(elapsed_ms * 1000)
            self.buckets[bisect.bisect_left(LATENCY_BUCKETS_MS, elapsed_ms)] += 1

    def latency(self) -> tuple[list[int], int]:
        """Since start: the calls in each latency bucket (LATENCY_BUCKETS_MS, then one for
        longer) and the latencies' sum in microseconds."""
        return ([seen + now for seen, now in zip(self.seen_buckets, self.buckets, strict=True)],
                self.seen_latency_us + self.latency_us)

    def _collect(self) -> None:
        if self.calls:
            self.pending["calls"] += self.calls
            self.pending["latency_us_sum"] += self.latency_us
            self.seen_latency_us += self.latency_us
            for index, (name, count) in enumerate(zip(_BUCKET_NAMES, self.buckets, strict=True)):
                if count:
                    self.pending[name] += count
                    self.seen_buckets[index] += count
            self.calls, self.latency_us = 0, 0
            self.buckets = [0] * len(_BUCKET_NAMES)

    def flush_commands(self, key: str, force: bool = False) -> list[list[Arg]]:
        """HINCRBY commands for what was counted since the last flush (at most once a second
        unless forced)."""
        now = time.monotonic()
        if now - self.last_flush < FLUSH_EVERY_S and not force:
            return []
        self._collect()
        if not self.pending:
            return []
        self.last_flush = now
        commands: list[list[Arg]] = [["HINCRBY", key, name, value]
                                     for name, value in self.pending.items()]
        commands.append(["HSET", key, "flushed_ms", now_ms()])  # how current they are
        self.pending.clear()
        return commands
