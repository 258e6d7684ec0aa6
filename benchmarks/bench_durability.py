"""The durability part of `stateworker bench`: `state::set` in `fast` and in `strict`, side by
side in one run, as the ratio strict / fast.

Each mode gets a fresh redis-server of its own (embedded, unix socket, on the same disk):
`fast` with `appendfsync everysec`, `strict` with `appendfsync always`. The set is measured
through a StateStore (Redis's reply is the acknowledgement) and over the bus (a `stateworker
serve` process with STATEWORKER_DURABILITY set), fast and strict in alternation, medians kept.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import Op, timed
from stateworker.bus.client import StateClient
from stateworker.settings import APPENDFSYNC, Settings
from stateworker.state.api import StateStore
from stateworker.transport.embedded import EmbeddedRedis

PREFIX = "benchdur"
VALUE = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
CASES = (("store", 1), ("store", 64), ("bus", 64))


class Mode(dict[str, Op]):
    """The ops of one mode by name ("store", "bus": a set; "bus_get": a get over the bus), with
    the redis-server they run on, the bus's own redis-server (or None: the bus on `server`),
    the service's process and the bus client."""

    def __init__(self, server: EmbeddedRedis, ops: dict[str, Op],
                 service: subprocess.Popen[str], client: StateClient,
                 bus: EmbeddedRedis | None = None) -> None:
        super().__init__(ops)
        self.server, self.service, self.client, self.bus = server, service, client, bus


@asynccontextmanager
async def durability_mode(directory: Path, durability: str, env: dict[str, str] | None = None,
                          split_bus: bool = False) -> AsyncIterator[Mode]:
    """A redis-server, a store and a service in `durability` (its environment plus `env`);
    yields the set of each path (and the bus's get: `Mode`). `split_bus`: the bus on a second
    redis-server of its own (`appendfsync everysec`; STATEWORKER_BUS_REDIS_URL)."""
    server = EmbeddedRedis(directory, APPENDFSYNC[durability])
    await server.start()
    bus: EmbeddedRedis | None = None
    if split_bus:
        bus = EmbeddedRedis(directory / "bus", APPENDFSYNC["fast"])
        await bus.start()
        env = {**(env or {}), "STATEWORKER_BUS_REDIS_URL": bus.url}
    service = start_service(server.url, PREFIX,
                            {"STATEWORKER_DURABILITY": durability, **(env or {})})
    try:
        async with AsyncExitStack() as stack:
            store = await stack.enter_async_context(StateStore.open(
                server.url, prefix=PREFIX, reaper=False, durability=durability))
            client = await stack.enter_async_context(StateClient(
                settings=Settings(redis_url=server.url, prefix=PREFIX,
                                  bus_redis_url=bus.url if bus is not None else None)))

            async def store_set(w: int, i: int) -> Any:
                return await store.call_json(
                    "state::set", b'{"scope":"bench","key":"s%d","value":%s}' % (w, VALUE))

            async def bus_set(w: int, i: int) -> Any:
                return await client.call_json(
                    "state::set", b'{"scope":"bench","key":"b%d","value":%s}' % (w, VALUE))

            async def bus_get(w: int, i: int) -> Any:
                return await client.call_json("state::get",
                                              b'{"scope":"bench","key":"b%d"}' % w)

            await bus_set(0, 0)  # warm up: the service has loaded its scripts and group
            yield Mode(server, {"store": store_set, "bus": bus_set, "bus_get": bus_get},
                       service, client, bus)
    finally:
        service.terminate()
        service.wait(timeout=30)
        await server.stop()
        if bus is not None:
            await bus.stop()


async def durability_section(seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    rates: dict[tuple[str, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sw-bench-durability-") as tmp:
        async with durability_mode(Path(tmp) / "fast", "fast") as fast, \
                durability_mode(Path(tmp) / "strict", "strict") as strict:
            for _ in range(rounds):
                for path, concurrency in CASES:
                    for mode, ops in (("fast", fast), ("strict", strict)):
                        rate = (await timed(ops[path], concurrency, seconds))[0]
                        rates.setdefault((path, mode, concurrency), []).append(rate)
    figures: dict[str, Any] = {}
    print(f"\n{'durability (state::set)':<28}{'conc':>5}{'fast ops/s':>13}{'strict ops/s':>14}"
          f"{'strict/fast':>13}", file=out)
    for path, concurrency in CASES:
        fast_rate = statistics.median(rates[(path, "fast", concurrency)])
        strict_rate = statistics.median(rates[(path, "strict", concurrency)])
        ratio = strict_rate / fast_rate
        figures[f"{path}_{concurrency}"] = {"fast": round(fast_rate), "strict": round(strict_rate),
                                            "strict_vs_fast": round(ratio, 3)}
        print(f"{path:<28}{concurrency:>5}{fast_rate:>13,.0f}{strict_rate:>14,.0f}{ratio:>13.2f}",
              file=out)
    return figures
