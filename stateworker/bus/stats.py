"""Counters of one service: calls, errors by code, latency. Kept in process, added to the
Redis hash `<prefix>:stats:<service>` with the reply writes (at most every FLUSH_EVERY_S), so
`stateworker status` of any process can show them. The same hash tells the service's dedupe
window (WINDOW_FIELD, written at start and with the counters): its clients re-send a call
only within half of it (bus/resends.py)."""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from stateworker.clock import now_ms
from stateworker.events.model import revision_of
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import Arg, ReplyError

# Latency buckets (upper bounds in ms) of the `latency_le_<ms>` counters.
LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)
FLUSH_EVERY_S = 0.25  # counters reach Redis at most this late (status reads them there)


_BUCKET_NAMES = [f"latency_le_{bound}ms" for bound in LATENCY_BUCKETS_MS] + ["latency_gt_5000ms"]


OTHER_FUNCTION = "other"  # the label of every name the service does not serve
WINDOW_FIELD = "dedupe_window_ms"  # the stats hash's field telling the service's dedupe window
CONSUMERS_REMOVED = "consumers_removed"  # the counter of dead consumers removed (bus/upkeep.py)


class Stats:
    """Counts on the hot path are plain integers; names are made once a second."""

    def __init__(self, functions: Iterable[str] = (), dedupe_window_ms: int | None = None
                 ) -> None:
        """`functions`: the names the service serves, each a label of its own in `codes` and
        `latencies`; any other name is counted as OTHER_FUNCTION (callers choose the
        names: one label each would grow without limit). `dedupe_window_ms`: how long the
        service keeps a call's record, told in the hash (None: nothing told)."""
        self.told: list[Arg] = [] if dedupe_window_ms is None else [WINDOW_FIELD,
                                                                      dedupe_window_ms]
        self.pending: Counter[str] = Counter()
        self.calls = 0
        self.total = 0  # calls this runtime answered since it started (the hash sums replicas)
        self.latency_us = 0
        self.buckets = [0] * len(_BUCKET_NAMES)
        self.last_flush = time.monotonic()
        # Since start, for /metrics (app/metrics.py), per function label: its calls by code
        # ("OK" for a success), and its latency buckets with their sum (in us) last.
        self.codes: dict[str, Counter[str]] = {}
        self.latencies: dict[str, list[int]] = {}
        # A name -> its label's figures, so that a call costs one lookup.
        self._figures: dict[str, tuple[Counter[str], list[int]]] = {}
        for fn in (*functions, OTHER_FUNCTION):
            self.codes[fn], self.latencies[fn] = Counter(), [0] * (len(_BUCKET_NAMES) + 1)
            self._figures[fn] = (self.codes[fn], self.latencies[fn])
        self._other = self._figures[OTHER_FUNCTION]

    def function_label(self, fn: str) -> str:
        """A function's label: its name when the service serves it, else OTHER_FUNCTION."""
        return fn if fn in self._figures else OTHER_FUNCTION

    def count(self, error_code: str | None, started: float | None, fn: str | None = None
              ) -> None:
        self.calls += 1
        self.total += 1
        codes, latencies = self._figures.get(fn or "", self._other)
        codes[error_code or "OK"] += 1
        if error_code is not None:
            self.pending[f"errors:{error_code}"] += 1
        if started is not None:
            elapsed_ms = (time.perf_counter() - started) * 1000
            elapsed_us = int(elapsed_ms * 1000)
            bucket = bisect.bisect_left(LATENCY_BUCKETS_MS, elapsed_ms)
            self.latency_us += elapsed_us
            self.buckets[bucket] += 1
            latencies[bucket] += 1
            latencies[-1] += elapsed_us

    def _collect(self) -> None:
        if self.calls:
            self.pending["calls"] += self.calls
            self.pending["latency_us_sum"] += self.latency_us
            for name, count in zip(_BUCKET_NAMES, self.buckets, strict=True):
                if count:
                    self.pending[name] += count
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
        commands.append(["HSET", key, "flushed_ms", now_ms(), *self.told])  # how current they are
        self.pending.clear()
        return commands

    def tell_commands(self, key: str) -> list[list[Arg]]:
        """What the service tells in the hash before it counts anything (its start)."""
        return [["HSET", key, *self.told]] if self.told else []


class Backlog(NamedTuple):
    """A consumer group's backlog on a call stream."""

    pending: int  # entries read, not yet acknowledged
    lag: int | None  # entries not yet read (None: Redis cannot tell, entries were deleted)
    oldest_ms: int | None  # when the oldest entry of either kind was added (None: none)


async def stream_backlog(conn: RedisConnection, stream: str, group: str) -> Backlog | None:
    """`group`'s backlog on `stream` as XINFO GROUPS reports it, and the oldest entry it has
    not acknowledged: the first pending, else the first after its last delivered (None: no
    such stream or group)."""
    try:
        groups = await conn.execute("XINFO", "GROUPS", stream)
    except ReplyError:
        return None
    infos = [dict(zip(flat[::2], flat[1::2], strict=True)) for flat in groups]
    info = next((i for i in infos if i.get(b"name") == group.encode()), None)
    if info is None:
        return None
    pending, lag = int(info.get(b"pending") or 0), info.get(b"lag")
    oldest: bytes | None = None
    if pending:  # (older than every entry not read: each was read after it)
        oldest = (await conn.execute("XPENDING", stream, group))[1]
    elif lag != 0:
        after = await conn.execute("XRANGE", stream, b"(" + info[b"last-delivered-id"], "+",
                                   "COUNT", 1)
        oldest = after[0][0] if after else None
    return Backlog(pending, None if lag is None else int(lag),
                   None if oldest is None else revision_of(oldest)[0])
