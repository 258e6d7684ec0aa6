"""The floor bench's (benchmarks/bench_floor.py) shared parts: the processes it starts and
stops (the plain worker), their CPU read from /proc/<pid>/stat, the `state::set` every side
runs, and the sides measured in alternation, rounds of each, with their medians.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_bus import started
from benchmarks.benchtime import Op, timed

PREFIX, TRIGGERED, PLAIN = "benchfloor", "benchfloortrig", "benchplain"
VALUE = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str) -> float:
    """utime + stime (s) of a /proc/<pid>/stat line: fields 14 and 15, counted after the
    command's closing parenthesis (a command may hold spaces and parentheses)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def process_cpu(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


async def timed_cpus(op: Op, concurrency: int, seconds: float, pids: dict[str, int]
                     ) -> tuple[float, list[float], dict[str, float]]:
    """`timed`, plus the CPU seconds per op over the measurement of each process of `pids` (by
    name) and of this one ("caller": every thread of it, a client library's too)."""
    before = {name: process_cpu(pid) for name, pid in pids.items()}
    caller = time.process_time()
    rate, latencies = await timed(op, concurrency, seconds)
    calls = max(1, len(latencies))
    cpus = {name: (process_cpu(pid) - before[name]) / calls for name, pid in pids.items()}
    return rate, latencies, {"caller": (time.process_time() - caller) / calls, **cpus}


async def timed_cpu(op: Op, concurrency: int, seconds: float, pid: int | None = None
                    ) -> tuple[float, list[float], float]:
    """`timed`, plus the CPU seconds per op of process `pid` over the measurement."""
    rate, latencies, cpus = await timed_cpus(op, concurrency, seconds,
                                             {"server": pid} if pid else {})
    return rate, latencies, cpus.get("server", 0.0)


def set_op(caller: Any) -> Op:
    """A `state::set` of VALUE through `caller` (a StateClient or StateStore): worker w
    writes key k<w> of scope s<w % 10> (the scopes the 10 triggers match)."""
    async def op(w: int, i: int) -> Any:
        return await caller.call_json(
            "state::set", b'{"scope":"s%d","key":"k%d","value":%s}' % (w % 10, w, VALUE))
    return op


def start_plain_worker(url: str, prefix: str = PLAIN) -> subprocess.Popen[str]:
    return started([sys.executable, "-m", "benchmarks.plain_worker", "--redis-url", url,
                    "--prefix", prefix], '"ready"', "the plain worker")


def stop_process(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def alternated(ops: dict[str, tuple[Any, int | None]], seconds: float, rounds: int,
                      redis_pid: int | None = None
                      ) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Each side's rate and CPU per call at 64 in flight, the sides in alternation each round
    (a side's pid: its serving process, whose CPU is the side's "server"; None: none). Per
    call, with `redis_pid`: the CPU of this process ("caller": whichever side's client runs,
    the others idle), of the server and of redis-server ("redis")."""
    rates: dict[str, list[float]] = {name: [] for name in ops}
    cpus: dict[str, dict[str, list[float]]] = {
        name: {"server": [], "caller": [], "redis": []} for name in ops}
    for _ in range(rounds):
        for name, (op, pid) in ops.items():
            caller, redis = time.process_time(), process_cpu(redis_pid) if redis_pid else 0.0
            rate, latencies, cpu = await timed_cpu(op, 64, seconds, pid)
            calls = max(1, len(latencies))
            rates[name].append(rate)
            cpus[name]["server"].append(cpu)
            cpus[name]["caller"].append((time.process_time() - caller) / calls)
            if redis_pid:
                cpus[name]["redis"].append((process_cpu(redis_pid) - redis) / calls)
    return rates, cpus


def budget(cpus: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per side, the medians (us per call) of each process's CPU and their sum."""
    out: dict[str, dict[str, float]] = {}
    for name, parts in cpus.items():
        medians = {part: round(median(values) * 1e6, 1) for part, values in parts.items()}
        out[name] = {**medians, "total": round(sum(medians.values()), 1)}
    return out


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
