"""The snapshot part of `stateworker bench`: what the PostgreSQL snapshot costs and how far
behind it runs, in one run, against a PostgreSQL the bench starts itself (initdb/pg_ctl).

- Bus `state::set` at 64 in flight through a `stateworker serve` process in `fast` and
  `strict`, each with the snapshot off and on (four services, each on its own fresh
  redis-server: bench_durability's modes), measured in alternation, medians kept; printed as
  ratios to `fast` without the snapshot. Before each measurement every snapshot has caught
  up, so no mode pays for another's backlog; after it, the time the snapshot took to catch
  up with what was written is shown too (a snapshot that keeps up shows about 0).
- The snapshot's lag at a paced 1,000 writes/s: `stateworker status`'s snapshot part (the
  age of the oldest event PostgreSQL has not acknowledged, the largest over the partitions)
  sampled while writing; p50 and max in ms.
- Restore speed: `stateworker restore` of RESTORE_ENTRIES entries from that snapshot into an
  empty redis-server, in entries/s (the summary's own seconds, and the whole command's).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg

from benchmarks.bench_durability import PREFIX, durability_mode
from benchmarks.benchtime import Op, percentile, timed
from benchmarks.pgserver import PostgresServer
from stateworker.app.cli import status_report
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from stateworker.transport.embedded import EmbeddedRedis, socket_url

MODES = (("fast", False), ("fast", True), ("strict", False), ("strict", True))
PACED_RATE = 1000  # writes/s while the lag is sampled
PACED_WORKERS = 32
SAMPLE_EVERY_S = 0.05
RESTORE_ENTRIES = 20_000
CATCH_UP_TIMEOUT_S = 300.0


def _name(durability: str, snapshot: bool) -> str:
    return f"{durability}_{'snapshot' if snapshot else 'no_snapshot'}"


async def snapshot_lag(url: str) -> tuple[int, int] | None:
    """(events, ms) the snapshot is behind, the largest over the partitions; None before
    its first commit."""
    shown = (await status_report(Settings(redis_url=url, prefix=PREFIX)))["snapshot"]
    if shown is None or any(p["position"] is None for p in shown["partitions"]):
        return None
    return (max(p["lag_events"] for p in shown["partitions"]),
            max(p["lag_ms"] or 0 for p in shown["partitions"]))


async def catch_up_s(url: str) -> float:
    """Seconds until the snapshot of the service on `url` is at every stream's end."""
    start = time.perf_counter()
    while (await snapshot_lag(url) or (1, 0))[0]:
        if time.perf_counter() - start > CATCH_UP_TIMEOUT_S:
            raise TimeoutError(f"the snapshot did not catch up in {CATCH_UP_TIMEOUT_S} s")
        await anyio.sleep(0.01)
    return time.perf_counter() - start


@asynccontextmanager
async def _postgres() -> AsyncIterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.init()
        server.start()
        try:
            with psycopg.connect(server.url, autocommit=True) as admin:
                for durability in {durability for durability, _ in MODES}:
                    admin.execute(f'CREATE DATABASE "{durability}"')
            yield server
        finally:
            server.stop()
    finally:
        server.remove()


async def snapshot_section(seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sw-bench-snapshot-") as tmp:
        async with _postgres() as postgres, AsyncExitStack() as stack:
            ops: dict[str, Op] = {}
            urls: dict[str, str] = {}
            for durability, snapshot in MODES:
                name, directory = _name(durability, snapshot), Path(tmp) / _name(
                    durability, snapshot)
                env = {"STATEWORKER_POSTGRES_URL": postgres.url_for(durability)} if snapshot \
                    else {}
                paths = await stack.enter_async_context(durability_mode(directory, durability,
                                                                        env))
                ops[name], urls[name] = paths["bus"], socket_url(directory)
            figures = await _throughput(ops, urls, seconds, rounds, out)
            fast_url = urls[_name("fast", True)]
            figures["lag"] = await _paced_lag(ops[_name("fast", True)], fast_url,
                                              max(5.0, 2 * seconds), out)
            figures["restore"] = await _restore(fast_url, postgres.url_for("fast"), Path(tmp),
                                                out)
    return figures


async def _throughput(ops: dict[str, Op], urls: dict[str, str], seconds: float, rounds: int,
                      out: Any) -> dict[str, Any]:
    rates: dict[str, list[float]] = {}
    trailing: dict[str, list[float]] = {}
    snapshotting = [_name(durability, True) for durability, snapshot in MODES if snapshot]
    for _ in range(rounds):
        for name, op in ops.items():
            for other in snapshotting:
                await catch_up_s(urls[other])
            rates.setdefault(name, []).append((await timed(op, 64, seconds))[0])
            if name in snapshotting:
                trailing.setdefault(name, []).append(await catch_up_s(urls[name]))
    base = statistics.median(rates[_name("fast", False)])
    figures: dict[str, Any] = {}
    print(f"\n{'snapshot (bus state::set, 64)':<30}{'ops/s':>10}{'vs fast, no snapshot':>22}"
          f"{'catch-up after, s':>19}", file=out)
    for name in ops:
        rate = statistics.median(rates[name])
        after = statistics.median(trailing[name]) if name in trailing else None
        figures[name] = {"ops_per_s": round(rate), "vs_fast_no_snapshot": round(rate / base, 3),
                         "catch_up_after_s": None if after is None else round(after, 3)}
        shown = "" if after is None else f"{after:.2f}"
        print(f"{name:<30}{rate:>10,.0f}{rate / base:>22.2f}{shown:>19}", file=out)
    for durability in ("fast", "strict"):
        cost = 1 - (figures[_name(durability, True)]["ops_per_s"]
                    / figures[_name(durability, False)]["ops_per_s"])
        figures[f"snapshot_cost_{durability}"] = round(cost, 3)
        print(f"snapshot cost in {durability} (1 - on/off): {cost:.1%} (target <= 15%)",
              file=out)
    return figures


async def _paced_lag(op: Op, url: str, seconds: float, out: Any) -> dict[str, Any]:
    """Writes at PACED_RATE for `seconds`, each at its due time, while the snapshot's lag is
    sampled from `stateworker status`."""
    await catch_up_s(url)
    total = int(PACED_RATE * seconds)
    start = time.perf_counter()
    lags_ms: list[float] = []
    late = 0

    async def writer(w: int) -> None:
        nonlocal late
        for i in range(w, total, PACED_WORKERS):
            delay = start + i / PACED_RATE - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            elif delay < -0.1:
                late += 1
            await op(w, i)

    async def sampler() -> None:
        while time.perf_counter() - start < seconds:
            shown = await snapshot_lag(url)
            if shown is not None:
                lags_ms.append(shown[1])
            await anyio.sleep(SAMPLE_EVERY_S)

    async with anyio.create_task_group() as tg:
        for w in range(PACED_WORKERS):
            tg.start_soon(writer, w)
        tg.start_soon(sampler)
    achieved = total / (time.perf_counter() - start)
    figures = {"writes_per_s": round(achieved), "samples": len(lags_ms),
               "p50_ms": round(percentile(lags_ms, 0.5)), "max_ms": round(max(lags_ms)),
               "writes_late_100ms": late}
    print(f"snapshot lag at {achieved:,.0f} writes/s ({len(lags_ms)} samples over "
          f"{seconds:.0f} s): p50 {figures['p50_ms']} ms, max {figures['max_ms']} ms "
          f"(target < 1000 ms)", file=out)
    return figures


async def _restore(url: str, postgres_url: str, tmp: Path, out: Any) -> dict[str, Any]:
    """Fill the snapshot up to RESTORE_ENTRIES entries, then time `stateworker restore` of
    them into an empty redis-server."""
    async with StateStore.open(url, prefix=PREFIX, reaper=False) as store:
        async def fill(w: int) -> None:
            for i in range(w, RESTORE_ENTRIES, 64):
                await store.call_json("state::set", b'{"scope":"restore","key":"r%06d",'
                                      b'"value":{"n":%d,"name":"bench"}}' % (i, i))

        async with anyio.create_task_group() as tg:
            for w in range(64):
                tg.start_soon(fill, w)
    await catch_up_s(url)
    empty = EmbeddedRedis(tmp / "restore")
    await empty.start()
    try:
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "stateworker", "--redis-url", empty.url, "restore"],
            env={**os.environ, "STATEWORKER_PREFIX": PREFIX,
                 "STATEWORKER_POSTGRES_URL": postgres_url},
            capture_output=True, text=True, check=True)
        wall = time.perf_counter() - start
    finally:
        await empty.stop()
    summary = msgspec.json.decode(done.stdout.strip().splitlines()[-1])
    figures = {"entries": summary["entries"], "seconds": round(summary["seconds"], 3),
               "entries_per_s": round(summary["entries"] / summary["seconds"]),
               "command_s": round(wall, 3),
               "command_entries_per_s": round(summary["entries"] / wall)}
    print(f"restore of {summary['entries']:,} entries: {figures['entries_per_s']:,} entries/s "
          f"({summary['seconds']:.2f} s; the whole command, Python's start included: "
          f"{wall:.2f} s, {figures['command_entries_per_s']:,} entries/s)", file=out)
    return figures

