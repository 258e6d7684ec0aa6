"""The bus part of `stateworker bench`: calls through a `stateworker serve` process, side by
side with the in-process StateStore and raw redis-py EVALSHA on the same Redis, in one run.

Client (this process), service (a subprocess) and Redis share the machine's cores, as the
issue asks: the figures are ratios measured in alternation, not absolute numbers.
"""

from __future__ import annotations

import os
import select
import statistics
import subprocess
import sys
from typing import Any

import redis.asyncio as aredis

from benchmarks.benchtime import RAW_SET_LUA, percentile, timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore

PREFIX = "benchbus"


def started(args: list[str], ready_word: str, what: str,
            env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A process of the bench, once its first line says `ready_word` (within 30 s)."""
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    if not ready or ready_word not in process.stdout.readline():
        process.kill()
        raise RuntimeError(f"{what} did not start for the benchmark")
    return process


def start_service(url: str, prefix: str = PREFIX, env: dict[str, str] | None = None
                  ) -> subprocess.Popen[str]:
    return started([sys.executable, "-m", "stateworker", "--redis-url", url, "serve",
                    "--log-level", "WARNING"], '"serving"', "the service",
                   {**os.environ, "STATEWORKER_PREFIX": prefix, **(env or {})})


async def bus_section(url: str, socket: str, seconds: float, rounds: int, out: Any
                      ) -> dict[str, Any]:
    service = start_service(url)
    raw = aredis.Redis(unix_socket_path=socket)
    script = raw.register_script(RAW_SET_LUA)
    value = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIX)) as client, \
                StateStore.open(url, prefix=PREFIX, reaper=False) as store:
            async def bus_set(w: int, i: int) -> Any:
                return await client.call_json(
                    "state::set", b'{"scope":"bench","key":"b%d","value":%s}' % (w, value))

            async def store_set(w: int, i: int) -> Any:
                return await store.call_json(
                    "state::set", b'{"scope":"bench","key":"s%d","value":%s}' % (w, value))

            async def raw_call(w: int, i: int) -> Any:
                return await script(keys=[f"raw:{{b}}:{w}", "raw:{b}:events"], args=[value, i])

            async def raw_pipeline(w: int, i: int) -> Any:
                async with raw.pipeline(transaction=False) as pipe:
                    for j in range(100):
                        await script(keys=[f"raw:{{b}}:{w}:{j}", "raw:{b}:events"],
                                     args=[value, i], client=pipe)
                    return await pipe.execute()

            await bus_set(0, 0)  # warm up: the service has loaded its scripts and group
            figures: dict[str, Any] = {}
            samples: dict[str, list[tuple[float, list[float]]]] = {}
            for _ in range(rounds):
                for name, op, concurrency in (
                    ("bus_1", bus_set, 1), ("bus_64", bus_set, 64),
                    ("store_1", store_set, 1), ("store_64", store_set, 64),
                    ("raw_call_1", raw_call, 1), ("raw_pipelined_100", raw_pipeline, 1),
                ):
                    rate, latencies = await timed(op, concurrency, seconds)
                    if name == "raw_pipelined_100":
                        rate *= 100
                    samples.setdefault(name, []).append((rate, latencies))
            for name, runs in samples.items():
                all_latencies = [lat for _, run in runs for lat in run]
                figures[name] = {
                    "ops_per_s": round(statistics.median(rate for rate, _ in runs)),
                    "p50_ms": round(percentile(all_latencies, 0.5) * 1000, 3),
                    "p99_ms": round(percentile(all_latencies, 0.99) * 1000, 3),
                }
    finally:
        service.terminate()
        service.wait(timeout=30)
        await raw.aclose()
    report(figures, out)
    return figures


def report(figures: dict[str, Any], out: Any) -> None:
    print(f"\n{'bus path (state::set)':<30}{'ops/s':>10}{'p50 ms':>10}{'p99 ms':>10}", file=out)
    for name, row in figures.items():
        print(f"{name:<30}{row['ops_per_s']:>10,}{row['p50_ms']:>10.3f}{row['p99_ms']:>10.3f}",
              file=out)
    pipelined = figures["raw_pipelined_100"]["ops_per_s"]
    ratios = {
        "bus_64_vs_raw_pipelined_100": figures["bus_64"]["ops_per_s"] / pipelined,
        "bus_64_vs_store_64": figures["bus_64"]["ops_per_s"] / figures["store_64"]["ops_per_s"],
        "bus_1_p50_vs_raw_call_p50": figures["bus_1"]["p50_ms"] / figures["raw_call_1"]["p50_ms"],
        "bus_1_vs_store_1": figures["bus_1"]["ops_per_s"] / figures["store_1"]["ops_per_s"],
    }
    for name, ratio in ratios.items():
        figures.setdefault("ratios", {})[name] = round(ratio, 3)
        print(f"{name:<40}{ratio:>8.2f}", file=out)
