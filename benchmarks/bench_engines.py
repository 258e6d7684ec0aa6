"""The engines part of `stateworker bench`: each front-end call (moco's activities, Dagu's
actions, a KeeperHub-style isolated call) side by side with the native call it maps to, over
the bus of one `stateworker serve` process, as ratios (compat ÷ native, target ≥ 0.9).

The two sides of a pair run in alternation, round by round (which goes first alternates
too), on the same service and Redis, so drift on this shared machine hits both alike. Both
write the same entries (the native call addresses the scope the front-end resolves to), so
neither side pays for a bigger keyspace, and both carry the same bus `context` (the caller
is the same program), so the ratio is the translation's cost alone.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import Op, timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings

PREFIX = "benchengines"
VALUE = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
MOCO = {"user_id": "u1"}
DAGU = {"dag_name": "etl"}
KEEPERHUB = {"org_id": "o1", "workflow_id": "w1", "execution_id": "e1"}


def cpu_seconds(pid: int) -> float:
    """The user + system CPU time a process has used so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measured(op: Op, concurrency: int, seconds: float, pid: int) -> tuple[float, float]:
    """Ops/s of `op`, and the service's CPU seconds per call while it ran."""
    before = cpu_seconds(pid)
    rate, latencies = await timed(op, concurrency, seconds)
    return rate, (cpu_seconds(pid) - before) / max(len(latencies), 1)


def pairs(client: StateClient) -> dict[str, tuple[Op, Op]]:
    """name -> (front-end call, the native call it maps to)."""
    def call(fn: str, body: bytes, context: dict[str, Any] | None = None) -> Op:
        async def op(w: int, i: int) -> Any:
            return await client.call_json(fn, body % w, context=context)
        return op

    return {
        "moco set_state / state::set": (
            call("builtin.state.set_state", b'{"namespace":"bench","key":"k%d","value":' + VALUE
                 + b"}", MOCO),
            call("state::set", b'{"scope":"u1:bench","key":"k%d","value":' + VALUE + b"}",
                 MOCO)),
        "moco get_state / state::get": (
            call("builtin.state.get_state", b'{"namespace":"bench","key":"k%d"}', MOCO),
            call("state::get", b'{"scope":"u1:bench","key":"k%d"}', MOCO)),
        "dagu state.set / state::set": (
            call("state.set", b'{"key":"k%d","value":' + VALUE + b"}", DAGU),
            call("state::set", b'{"scope":"dagu/dag/etl","key":"k%d","value":' + VALUE + b"}",
                 DAGU)),
        "dagu state.get / state::get-entry": (
            call("state.get", b'{"key":"k%d"}', DAGU),
            call("state::get-entry", b'{"scope":"dagu/dag/etl","key":"k%d"}', DAGU)),
        "isolated set / state::set": (
            call("state::set", b'{"isolation":"workflow","key":"k%d","max_keys":1000,"value":'
                 + VALUE + b"}", KEEPERHUB),
            call("state::set", b'{"scope":"wf/o1/w1","key":"k%d","max_keys":1000,"value":'
                 + VALUE + b"}", KEEPERHUB)),
    }


async def engines_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    figures: dict[str, Any] = {}
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIX)) as client:
            calls = pairs(client)
            for compat, native in calls.values():  # warm up; the reads find their keys
                for w in range(64):
                    await native(w, 0)
                    await compat(w, 0)
            for concurrency in (1, 64):
                for name, (compat, native) in calls.items():
                    runs: dict[Op, list[tuple[float, float]]] = {compat: [], native: []}
                    for round_ in range(rounds):
                        for op in (compat, native) if round_ % 2 == 0 else (native, compat):
                            runs[op].append(await measured(op, concurrency, seconds,
                                                           service.pid))
                    figures[f"{name} c={concurrency}"] = summary(runs[compat], runs[native])
    finally:
        service.terminate()
        service.wait(timeout=30)
    report(figures, out)
    return figures


def summary(compat: list[tuple[float, float]], native: list[tuple[float, float]]
            ) -> dict[str, Any]:
    """Medians over the rounds; the ratios are medians of each round's own pair (its two
    sides ran back to back, so what drifts between rounds cancels within a pair)."""
    return {
        "compat_ops_per_s": round(statistics.median(r for r, _ in compat)),
        "native_ops_per_s": round(statistics.median(r for r, _ in native)),
        "compat_cpu_us": round(statistics.median(c for _, c in compat) * 1e6),
        "native_cpu_us": round(statistics.median(c for _, c in native) * 1e6),
        "ratio": round(statistics.median(
            a / b for (a, _), (b, _) in zip(compat, native, strict=True)), 3),
        "cpu_ratio": round(statistics.median(  # (a side without a CPU tick: no ratio)
            [b / a for (_, a), (_, b) in zip(compat, native, strict=True) if a > 0 and b > 0]
            or [0.0]), 3),
    }


def report(figures: dict[str, Any], out: Any) -> None:
    """Throughput ratio (compat ÷ native ops/s) and cost ratio (native ÷ compat service CPU
    per call: what the service spends on one call), each the median of the rounds' pairs."""
    print(f"\n{'front-end call / native call':<40}{'compat/s':>9}{'native/s':>9}{'ratio':>7}"
          f"{'cpu us':>8}{'native':>8}{'ratio':>7}", file=out)
    for name, row in figures.items():
        print(f"{name:<40}{row['compat_ops_per_s']:>9,}{row['native_ops_per_s']:>9,}"
              f"{row['ratio']:>7.2f}{row['compat_cpu_us']:>8}{row['native_cpu_us']:>8}"
              f"{row['cpu_ratio']:>7.2f}", file=out)
