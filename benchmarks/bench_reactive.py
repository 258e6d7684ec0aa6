"""The reactive part of `scripts/bench`, measured in the same run as the bus's `state::set`:

- write -> handler-start latency (p50/p99) at a paced 1,000 events/s: a `Worker` handler
  in this process reads the write's send time from the value;
- dispatch throughput: a backlog of events handed on by a dispatcher, events/s as a ratio
  to the bus `set` rate;
- barrier arrivals/s over the bus as a ratio to the bus `set` rate;
- bus `set` throughput with 10 triggers registered (each matching one of the 10 scopes
  written) as a ratio to none.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import msgspec

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import paced, percentile, timed
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.reactive.dispatcher import Dispatcher
from stateworker.settings import Settings
from stateworker.state.api import StateStore

PREFIX = "benchreact"
RATE = 1000  # events/s for the latency figure
WARM_S = 0.25  # paced writes delivered before the counted ones (`warmed`)
BACKLOG = 20_000  # events for the dispatch throughput figure


async def reactive_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    settings = Settings(redis_url=url, prefix=PREFIX)
    figures: dict[str, Any] = {}
    try:
        async with StateClient(settings=settings) as client:
            await client.set("warm", "up", 1)
            figures["latency"] = await write_to_handler_latency(client, settings,
                                                                seconds * rounds)
            set_rates, trigger_rates, barrier_rates = [], [], []
            for _ in range(rounds):
                set_rates.append(await bus_sets(client, seconds))
                barrier_rates.append(await _barriers(client, seconds))
            await register_ten(client)
            for _ in range(rounds):
                trigger_rates.append(await bus_sets(client, seconds))
            await unregister_ten(client)
        bus_set = statistics.median(set_rates)
        figures["bus_set_64_ops_per_s"] = round(bus_set)
        figures["bus_set_64_with_10_triggers_ops_per_s"] = round(statistics.median(trigger_rates))
        figures["barrier_64_arrivals_per_s"] = round(statistics.median(barrier_rates))
    finally:
        service.terminate()
        service.wait(timeout=30)
    figures["dispatch_events_per_s"] = round(await _dispatch_backlog(url))
    figures["ratios"] = {
        "dispatch_vs_bus_set": round(figures["dispatch_events_per_s"] / bus_set, 3),
        "barrier_vs_bus_set": round(figures["barrier_64_arrivals_per_s"] / bus_set, 3),
        "set_with_10_triggers_vs_none": round(
            figures["bus_set_64_with_10_triggers_ops_per_s"] / bus_set, 3),
    }
    _report(figures, out)
    return figures


async def write_to_handler_latency(client: StateClient, settings: Settings, seconds: float
                                   ) -> dict[str, float]:
    """Paced writes (one every 1/RATE s); each handler start minus its write's send time,
    once a first write was delivered (the trigger loaded, the worker reading: `warmed`)."""
    delays: list[float] = []
    worker = Worker("benchhandler", settings=settings, options=BusOptions(block_ms=100))

    @worker.function("benchhandler::on_change")
    async def on_change(body: dict[str, Any], call: Call) -> None:
        delays.append(time.perf_counter() - body["new_value"]["t"])

    await client.call("state::register-trigger", {
        "id": "bench-latency", "function_id": "benchhandler::on_change",
        "service": "benchhandler", "config": {"scope": "latency"}})
    count = int(RATE * seconds)

    async def write(i: int) -> None:
        await client.set("latency", f"k{i % 100}", {"t": time.perf_counter()})

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await warmed(write, delays)
        await paced(write, count, RATE)
        with anyio.move_on_after(30):
            while len(delays) < count:
                await anyio.sleep(0.05)
        worker.stop()
    await client.call("state::unregister-trigger", {"id": "bench-latency"})
    return {"events": len(delays), "of": count,
            "p50_ms": round(percentile(delays, 0.5) * 1000, 3),
            "p99_ms": round(percentile(delays, 0.99) * 1000, 3)}


async def warmed(write: Callable[[int], Coroutine[Any, Any, Any]], delays: list[float]) -> None:
    """The path's first use (a new trigger's load, a new reader's first read) and what comes
    right after it are not the latency a running system has: one write delivered, then WARM_S
    of writes paced at RATE delivered, none counted. (A trigger registered after a burst of
    writes elsewhere: its dispatcher first reads past the events no trigger wants, up to a
    round's, 1 s, of them; after 8 s of 64-way sets that held up the first ~30 ms of
    deliveries by 10-20 ms, a p99 of its own.)"""
    await write(-1)
    with anyio.fail_after(30):
        while not delays:
            await anyio.sleep(0.01)
    delays.clear()
    warm = int(RATE * WARM_S)
    await paced(write, warm, RATE)
    with anyio.fail_after(30):
        while len(delays) < warm:
            await anyio.sleep(0.01)
    delays.clear()


async def bus_sets(client: StateClient, seconds: float) -> float:
    async def bus_set(w: int, i: int) -> Any:
        return await client.call_json(
            "state::set", b'{"scope":"s%d","key":"k%d","value":{"n":%d}}' % (w % 10, w, i))

    return (await timed(bus_set, 64, seconds))[0]


async def _barriers(client: StateClient, seconds: float) -> float:
    async def arrive(w: int, i: int) -> Any:
        body = {"event": {"key": f"w{w}-{i}"},
                "condition_config": {"id": f"bench-{w % 8}-{i // 5000}", "expect": 10_000}}
        return await client.call_json("state::barrier", msgspec.json.encode(body))

    return (await timed(arrive, 64, seconds))[0]


async def register_ten(client: StateClient) -> None:
    for n in range(10):
        await client.call("state::register-trigger", {
            "id": f"bench-{n}", "function_id": "nobody::reads", "service": "benchsink",
            "config": {"scope": f"s{n}"}})


async def unregister_ten(client: StateClient) -> None:
    for n in range(10):
        await client.call("state::unregister-trigger", {"id": f"bench-{n}"})


async def _dispatch_backlog(url: str) -> float:
    """A backlog written with no dispatcher running, then handed on by one: events/s. Nobody
    reads the sink, so its backlog bound is raised above the events handed on (at the default
    bound the dispatch would wait at 10,000 entries, as it should for a dead target)."""
    settings = Settings(redis_url=url, prefix=f"{PREFIX}d", dispatch=False,
                        trigger_backlog=2 * BACKLOG)
    async with StateStore.open(settings=settings, reaper=False) as store:
        await store.call("state::register-trigger", {
            "id": "backlog", "function_id": "nobody::reads", "service": "backlogsink"})

        async def writer(w: int) -> None:
            for i in range(w, BACKLOG, 64):
                await store.call_json("state::set",
                                      b'{"scope":"b%d","key":"k","value":%d}' % (w, i))

        async with anyio.create_task_group() as tg:
            for w in range(64):
                tg.start_soon(writer, w)
        dispatcher = Dispatcher(store.state)
        sink = store.state.keys.bus_stream("backlogsink")
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            while int(await store.state.conn.execute("XLEN", sink)) < BACKLOG:
                await anyio.sleep(0.01)
            elapsed = time.perf_counter() - start
            dispatcher.stop()
    return BACKLOG / elapsed


def _report(figures: dict[str, Any], out: Any) -> None:
    latency = figures["latency"]
    print(f"\n{'reactive':<44}{'value':>12}", file=out)
    print(f"{'write -> handler start p50 ms @1000/s':<44}{latency['p50_ms']:>12.3f}", file=out)
    print(f"{'write -> handler start p99 ms @1000/s':<44}{latency['p99_ms']:>12.3f}", file=out)
    for name in ("bus_set_64_ops_per_s", "bus_set_64_with_10_triggers_ops_per_s",
                 "barrier_64_arrivals_per_s", "dispatch_events_per_s"):
        print(f"{name:<44}{figures[name]:>12,}", file=out)
    for name, ratio in figures["ratios"].items():
        print(f"{name:<44}{ratio:>12.2f}", file=out)
