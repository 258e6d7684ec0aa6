"""The `shards` part of `stateworker bench`: bus `state::set` to a service whose calls spread
over 3 streams (STATEWORKER_BUS_SHARDS=3) side by side with the same calls to a 1-shard
service, in one run on one Redis: two services (each its own prefix), measured in
alternation. On one server the ratio shows what reading several streams costs (one
XREADGROUP over 3 streams, 3 consumer groups, 3 XAUTOCLAIMs); what shards buy is room on a
Redis Cluster, where each shard's stream lives with its partition on its own primary."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings

PREFIXES = {1: "benchshard_1", 3: "benchshard_3"}


async def shards_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    services = [start_service(url, prefix, env={"STATEWORKER_BUS_SHARDS": str(n)})
                for n, prefix in PREFIXES.items()]
    value = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIXES[1])) as one, \
                StateClient(settings=Settings(redis_url=url, prefix=PREFIXES[3],
                                              bus_shards=3)) as three:
            def setter(client: StateClient) -> Any:
                async def op(w: int, i: int) -> Any:
                    # One scope per worker: 64 workers' calls spread over every shard.
                    return await client.call_json(
                        "state::set", b'{"scope":"bench%d","key":"k","value":%s}' % (w, value))
                return op

            for client in (one, three):  # warm up: scripts loaded, groups made
                for w in range(64):
                    await setter(client)(w, 0)
            samples: dict[str, list[float]] = {}
            for _ in range(rounds):
                for concurrency in (1, 64):
                    for shards, client in ((1, one), (3, three)):
                        rate, _ = await timed(setter(client), concurrency, seconds)
                        samples.setdefault(f"shards_{shards}_{concurrency}", []).append(rate)
    finally:
        for service in services:
            service.terminate()
            service.wait(timeout=30)
    figures: dict[str, Any] = {name: round(statistics.median(rates))
                               for name, rates in samples.items()}
    figures["ratios"] = {
        f"shards_3_vs_1_at_{n}": round(figures[f"shards_3_{n}"] / figures[f"shards_1_{n}"], 3)
        for n in (1, 64)}
    print(f"\n{'sharded bus (state::set)':<30}{'ops/s':>10}", file=out)
    for name in ("shards_1_1", "shards_3_1", "shards_1_64", "shards_3_64"):
        print(f"{name:<30}{figures[name]:>10,}", file=out)
    for name, ratio in figures["ratios"].items():
        print(f"{name:<40}{ratio:>8.2f}", file=out)
    return figures
