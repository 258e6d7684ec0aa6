"""The bounds on what one caller can make the service hold (`scripts/bench --sections bounds`;
issue 39), each measured on a Redis of its own (its memory is a figure), the service in a
process of its own:

- trigger backlog: 1,000 triggers to a service nobody serves, then 1,000 writes of 1 KB: the
  target's stream and Redis's memory, against STATEWORKER_TRIGGER_BACKLOG (10,000 entries
  plus one event's calls); the writes' p50 with and without the dead target;
- fair share: a probe caller's p50 (one call at a time) alone, while another caller floods the
  shared stream with 100,000 calls (raw XADDs from a process of its own, as fast as one
  client can), and while the
  largest transaction allowed (STATEWORKER_MAX_CALL_BYTES of values) runs in a loop; the
  slowest script Redis ran (SLOWLOG);
- console tails: 500 tail requests beyond the cap (STATEWORKER_MAX_TAILS, 64), each refused
  507 RESOURCE_EXHAUSTED, and Redis's connections stay put.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import redis.asyncio as aredis

from benchmarks.bench_http import serve
from benchmarks.benchtime import percentile
from stateworker.bus.client import StateClient
from stateworker.keys import bus_stream
from stateworker.settings import Settings
from stateworker.transport.embedded import EmbeddedRedis

PREFIX = "bounds"
TRIGGERS, WRITES, FLOOD = 1_000, 1_000, 100_000
# The flooding caller: fire-and-forget sets, 10,000 XADDs a pipeline, as fast as it can.
FLOODER = """
import sys, redis
conn = redis.Redis(unix_socket_path=sys.argv[1])
body = b'{"scope":"flood","key":"k","value":1}'
for start in range(0, int(sys.argv[3]), 10_000):
    pipe = conn.pipeline(transaction=False)
    for n in range(start, start + 10_000):
        pipe.xadd(sys.argv[2], {"id": f"f-{n}", "fn": "state::set", "reply": "",
                                "caller": "flood", "body": body})
    pipe.execute()
"""


@contextlib.asynccontextmanager
async def fresh() -> AsyncIterator[tuple[EmbeddedRedis, dict[str, Any]]]:
    """A Redis of its own and a service on it."""
    with tempfile.TemporaryDirectory(prefix="sw-bounds-") as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        process, start = serve(server.url, PREFIX, http=True)
        try:
            yield server, start
        finally:
            process.terminate()
            process.wait(timeout=30)
            await server.stop()


async def latencies_while(op: Callable[[], Awaitable[Any]], busy: Callable[[], bool],
                          at_least: int = 20) -> list[float]:
    """`op`'s latencies (s), one at a time, while `busy()` (at least `at_least` of them)."""
    found: list[float] = []
    while busy() or len(found) < at_least:
        start = time.perf_counter()
        await op()
        found.append(time.perf_counter() - start)
    return found


def ms(values: list[float], fraction: float) -> float:
    return round(percentile(values, fraction) * 1000, 2)


async def backlog(out: Any) -> dict[str, Any]:
    async with fresh() as (server, _), StateClient(
            settings=Settings(redis_url=server.url, prefix=PREFIX)) as client:
        raw = aredis.Redis(unix_socket_path=str(server.socket))
        value = "x" * 1000
        alive = [await timed_call(client.set("warm", f"k{n}", value)) for n in range(200)]
        for n in range(TRIGGERS):
            await client.call("state::register-trigger", {
                "id": f"dead-{n}", "function_id": "dead::on_change", "service": "dead",
                "config": {}})
        before = int((await raw.info("memory"))["used_memory"])
        writes = [await timed_call(client.set("load", f"k{n}", value)) for n in range(WRITES)]
        stream = bus_stream(PREFIX, "dead")
        # The dispatch stops at the full stream and stays there: its length no longer moves.
        length, still = -1, 0
        while still < 10:
            await anyio.sleep(0.2)  # (a benchmark watching a stream settle, not a test)
            now = int(await raw.xlen(stream))
            still = still + 1 if now == length else 0
            length = now
        grown = int((await raw.info("memory"))["used_memory"]) - before
        await raw.aclose()
    figures = {"triggers": TRIGGERS, "writes": WRITES, "target_stream": length,
               "documented_bound": 10_000 + TRIGGERS,
               "redis_grown_mb": round(grown / 2**20, 1),
               "write_p50_ms_alive": ms(alive, 0.5), "write_p50_ms_dead_target": ms(writes, 0.5)}
    print(f"\n{'bounds: trigger backlog':<44}{'figure':>12}", file=out)
    for name, figure in figures.items():
        print(f"  {name:<42}{figure!s:>12}", file=out)
    return figures


async def timed_call(call: Awaitable[Any]) -> float:
    start = time.perf_counter()
    await call
    return time.perf_counter() - start


async def fair_share(out: Any) -> dict[str, Any]:
    async with fresh() as (server, _), StateClient(
            settings=Settings(redis_url=server.url, prefix=PREFIX), caller="probe") as probe:
        raw = aredis.Redis(unix_socket_path=str(server.socket))
        stream = bus_stream(PREFIX, "state")

        async def probe_op() -> None:
            await probe.set("probe", "k", 1)

        alone = await latencies_while(probe_op, lambda: False, 300)
        flooding = True

        async def flood() -> None:
            # From a process of its own (as another client would), so that building 100,000
            # commands does not hold up the probe's own event loop.
            nonlocal flooding
            await anyio.run_process([sys.executable, "-c", FLOODER, str(server.socket), stream,
                                     str(FLOOD)], check=True)
            while await raw.xlen(stream):  # until the service has served the flood
                await anyio.sleep(0.05)
            flooding = False

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(flood)
            during = await latencies_while(probe_op, lambda: flooding)
        drained = time.perf_counter() - started

        # The largest transaction allowed: 4 updates of ~0.9 MiB values (~7.3 MiB read and
        # written, within the 8 MiB of STATEWORKER_MAX_CALL_BYTES), in a loop.
        big = {"a": ["x" * 100] * 9000, "n": 0}
        for n in range(4):
            await probe.set("big", f"k{n}", big)
        await raw.slowlog_reset()
        running, transactions = True, 0

        async def largest() -> None:
            nonlocal running, transactions
            async with StateClient(settings=Settings(redis_url=server.url, prefix=PREFIX),
                                   caller="big") as other:
                deadline = time.perf_counter() + 5
                while time.perf_counter() < deadline:
                    await other.transaction("big", [
                        {"op": "update", "key": f"k{n}",
                         "ops": [{"type": "increment", "path": "n", "by": 1}]}
                        for n in range(4)])
                    transactions += 1
            running = False

        async with anyio.create_task_group() as tg:
            tg.start_soon(largest)
            beside = await latencies_while(probe_op, lambda: running)
        slowest = max((entry["duration"] for entry in await raw.slowlog_get(128)), default=0)
        await raw.aclose()
    figures = {"probe_p50_ms_alone": ms(alone, 0.5),
               "probe_calls_flood_100k": len(during),
               "probe_p50_ms_flood_100k": ms(during, 0.5),
               "probe_p99_ms_flood_100k": ms(during, 0.99),
               "probe_max_ms_flood_100k": round(max(during) * 1000, 2),
               "flood_drained_s": round(drained, 2),
               "probe_p50_ms_largest_tx": ms(beside, 0.5),
               "probe_p99_ms_largest_tx": ms(beside, 0.99),
               "largest_tx_runs": transactions,
               "slowest_script_ms": round(slowest / 1000, 1)}
    print(f"\n{'bounds: fair share (probe, one at a time)':<44}{'figure':>12}", file=out)
    for name, figure in figures.items():
        print(f"  {name:<42}{figure!s:>12}", file=out)
    return figures


async def tails(out: Any) -> dict[str, Any]:
    async with fresh() as (server, start), contextlib.AsyncExitStack() as stack:
        raw = aredis.Redis(unix_socket_path=str(server.socket))
        http = await stack.enter_async_context(httpx.AsyncClient(
            base_url=f"http://{start['http']}", timeout=30,
            limits=httpx.Limits(max_connections=None)))
        before = int((await raw.info("clients"))["connected_clients"])
        opened = 0
        for _ in range(8):  # `off` mode: the cap per client address (8) comes first
            tail = await stack.enter_async_context(http.stream("GET", "/v1/console/tail"))
            opened += tail.status_code == 200
        codes: dict[str, int] = {}
        for _ in range(500):
            over = await http.get("/v1/console/tail")
            code = over.json()["error"]["code"] if over.status_code != 200 else "200"
            codes[f"{over.status_code} {code}"] = codes.get(f"{over.status_code} {code}", 0) + 1
        after = int((await raw.info("clients"))["connected_clients"])
        await raw.aclose()
    figures = {"open": opened, "beyond_the_cap": 500, "answers": codes,
               "redis_clients_grown": after - before}
    print(f"\n{'bounds: console tails':<44}{'figure':>12}", file=out)
    for name, figure in figures.items():
        print(f"  {name:<42}{figure!s:>12}", file=out)
    return figures


async def bounds_section(out: Any) -> dict[str, Any]:
    return {"backlog": await backlog(out), "fair_share": await fair_share(out),
            "tails": await tails(out)}
