"""Timing for the benchmarks: ops/s and latencies of an operation run by N tasks."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio

# The raw side of every comparison: a minimal script with the write and the event of a set.
RAW_SET_LUA = """
redis.call('HSET', KEYS[1], 'v', ARGV[1], 'n', ARGV[2])
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', 'v', ARGV[1])
"""

Op = Callable[[int, int], Awaitable[Any]]  # (worker, iteration) -> awaitable


async def timed(op: Op, concurrency: int, seconds: float) -> tuple[float, list[float]]:
    """Ops/s and every op's latency (s) of `op` run by `concurrency` tasks for `seconds`."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            await op(w, i)
            latencies.append(time.perf_counter() - start)
            i += 1

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(concurrency):
            tg.start_soon(worker, w)
    return len(latencies) / (time.perf_counter() - start), latencies


async def paced(write: Callable[[int], Coroutine[Any, Any, Any]], count: int, rate: float
                ) -> None:
    """`count` writes, write i started at i / `rate` s (each in a task of its own, so a slow
    one does not hold back the next), back when all have returned."""
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            await anyio.sleep(max(0.0, start + i / rate - time.perf_counter()))
            tg.start_soon(write, i)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def _cpu_times() -> tuple[int, int]:
    """The machine's busy and total CPU ticks since boot (/proc/stat; idle and iowait are
    not busy)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


async def quiet(busy_cores: float = 0.3, window_s: float = 0.2, timeout_s: float = 10.0
                ) -> float:
    """Wait until fewer than `busy_cores` cores were busy over one `window_s` (what earlier
    measures left running is done: an AOF rewrite, a server's snapshot or compaction), at
    most `timeout_s`; the cores busy in the last window."""
    cores = len(os.sched_getaffinity(0))
    deadline = time.monotonic() + timeout_s
    while True:
        busy, total = _cpu_times()
        await anyio.sleep(window_s)
        busy2, total2 = _cpu_times()
        share = cores * (busy2 - busy) / max(1, total2 - total)
        if share < busy_cores:
            return share
        if time.monotonic() >= deadline:
            print(f"(the machine is not quiet after {timeout_s:g} s: {share:.2f} cores busy; "
                  "measuring anyway)", file=sys.stderr)
            return share
