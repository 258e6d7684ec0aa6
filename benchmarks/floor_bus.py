"""The floor bench's lines 1 to 4 (benchmarks/bench_floor.py): on one Redis (the run's), bus
`state::set` at 64 in flight against the in-process store and the plain worker, with the CPU
per call of each process; one call at a time against one raw EVALSHA; with 10 triggers
registered against none, and a trigger's write -> handler start latency. Line 7: 1 and 3 again
on a 3+3 Redis Cluster.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aredis

from benchmarks import bench_reactive
from benchmarks.bench_bus import start_service
from benchmarks.benchtime import RAW_SET_LUA, percentile
from benchmarks.floor_process import (
    PLAIN,
    PREFIX,
    TRIGGERED,
    VALUE,
    alternated,
    budget,
    median,
    set_op,
    start_plain_worker,
    stop_process,
)
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore


async def bus_lines(url: str, socket_path: str, seconds: float, rounds: int) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    triggered = start_service(url, TRIGGERED)
    plain = start_plain_worker(url)
    raw = aredis.Redis(unix_socket_path=socket_path)
    script = raw.register_script(RAW_SET_LUA)
    figures: dict[str, Any] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                StateClient(settings=Settings(redis_url=url, prefix=PREFIX)))
            trig_settings = Settings(redis_url=url, prefix=TRIGGERED)
            trig_client = await stack.enter_async_context(StateClient(settings=trig_settings))
            plain_client = await stack.enter_async_context(
                StateClient(settings=Settings(redis_url=url, prefix=PLAIN)))
            store = await stack.enter_async_context(
                StateStore.open(url, prefix=PREFIX, reaper=False))
            await bench_reactive.register_ten(trig_client)
            ops = {"bus": (set_op(client), service.pid), "store": (set_op(store), None),
                   "plain": (set_op(plain_client), plain.pid),
                   "triggers": (set_op(trig_client), triggered.pid)}
            for op, _ in ops.values():
                await op(0, 0)  # warm up: scripts loaded, groups made
            redis_pid = int((await raw.info("server"))["process_id"])
            rates, cpus = await alternated(ops, seconds, rounds, redis_pid)
            figures["set_64_ops_per_s"] = {name: round(median(r)) for name, r in rates.items()}
            figures["cpu_us_per_call_64"] = {
                name: round(median(cpus[name]["server"]) * 1e6, 1)
                for name in ("bus", "plain", "triggers")}
            figures["budget_us_per_call_64"] = budget(cpus)

            # 2: one at a time, interleaved: bus call, raw EVALSHA, bus call ...
            bus_one, raw_one = set_op(client), 0
            bus_lat: list[float] = []
            raw_lat: list[float] = []
            end = time.perf_counter() + seconds * rounds
            while time.perf_counter() < end:
                start = time.perf_counter()
                await bus_one(0, raw_one)
                bus_lat.append(time.perf_counter() - start)
                start = time.perf_counter()
                await script(keys=["raw:{b}:0", "raw:{b}:events"], args=[VALUE, raw_one])
                raw_lat.append(time.perf_counter() - start)
                raw_one += 1
            figures["one_at_a_time"] = {
                "calls": len(bus_lat),
                "bus_p50_ms": round(percentile(bus_lat, 0.5) * 1000, 3),
                "raw_evalsha_p50_ms": round(percentile(raw_lat, 0.5) * 1000, 3),
                "bus_p99_ms": round(percentile(bus_lat, 0.99) * 1000, 3),
                "raw_evalsha_p99_ms": round(percentile(raw_lat, 0.99) * 1000, 3)}

            # 4: write -> handler start at 1,000 events/s, the 10 triggers registered
            figures["handler_latency_10_triggers"] = (
                await bench_reactive.write_to_handler_latency(trig_client, trig_settings,
                                                              seconds * rounds))
            await bench_reactive.unregister_ten(trig_client)
    finally:
        for process in (service, triggered, plain):
            stop_process(process)
        await raw.aclose()
    return figures


# --- 7: ratios 1 and 3 on the 3+3 cluster ------------------------------------------------------

async def cluster_lines(seconds: float, rounds: int) -> dict[str, Any]:
    """Bus `set` at 64 (STATEWORKER_BUS_SHARDS=3, as bench_cluster's cluster side) vs the
    in-process store and the plain worker (its one stream, each scope's keys in one slot) on
    one 3+3 cluster (tests/cluster.py), with the service's and the plain worker's CPU per call."""
    from benchmarks.bench_cluster import RedisCluster  # (starts nothing at import)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sw-bench-floor-cluster-") as tmp:
        cluster = RedisCluster(Path(tmp) / "cluster")
        cluster.start()
        urls: str = cluster.urls
        service = plain = None
        try:
            service = start_service(urls, PREFIX, env={"STATEWORKER_BUS_SHARDS": "3"})
            plain = start_plain_worker(urls)
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(StateClient(
                    settings=Settings(redis_url=urls, prefix=PREFIX, bus_shards=3)))
                plain_client = await stack.enter_async_context(
                    StateClient(settings=Settings(redis_url=urls, prefix=PLAIN)))
                store = await stack.enter_async_context(
                    StateStore.open(urls, prefix=PREFIX, reaper=False))
                ops = {"bus": (set_op(client), service.pid), "store": (set_op(store), None),
                       "plain": (set_op(plain_client), plain.pid)}
                for op, _ in ops.values():
                    for w in range(10):
                        await op(w, 0)  # warm up: scripts loaded on every primary
                rates, cpus = await alternated(ops, seconds, rounds)
            figures["set_64_ops_per_s"] = {name: round(median(r)) for name, r in rates.items()}
            figures["cpu_us_per_call_64"] = {name: round(median(cpus[name]["server"]) * 1e6, 1)
                                             for name in ("bus", "plain")}
        finally:
            for process in (service, plain):
                if process is not None:
                    stop_process(process)
            cluster.kill()
    return figures
