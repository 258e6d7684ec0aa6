"""`stateworker bench`: the store side by side with raw redis-py in one run, as ratios.

Both sides talk to the same fresh redis-server (AOF everysec, unix socket) started for the run.
Each pair is measured in alternation (ours, raw, ours, raw ...) and the median of the rounds is
kept, so drift on this shared machine hits both sides alike.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec
import redis.asyncio as aredis

from benchmarks import (
    bench_acl,
    bench_bounds,
    bench_bus,
    bench_cluster,
    bench_console,
    bench_dedupe,
    bench_durability,
    bench_engines,
    bench_floor,
    bench_getmany,
    bench_http,
    bench_msgpack,
    bench_peers,
    bench_query,
    bench_reactive,
    bench_shards,
    bench_snapshot,
    bench_txn,
)
from benchmarks.benchtime import RAW_SET_LUA, Op, timed
from stateworker.loop import run as run_loop
from stateworker.state.api import StateStore
from stateworker.transport.embedded import EmbeddedRedis


async def paired(ours: Op, raw: Op, concurrency: int, seconds: float, rounds: int) -> tuple[float, float]:
    ours_rates, raw_rates = [], []
    for _ in range(rounds):
        ours_rates.append((await timed(ours, concurrency, seconds))[0])
        raw_rates.append((await timed(raw, concurrency, seconds))[0])
    return statistics.median(ours_rates), statistics.median(raw_rates)


async def run(seconds: float, rounds: int, out: Any, sections: set[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sw-bench-") as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        try:
            figures: dict[str, Any] = {"seconds": seconds, "rounds": rounds}
            if "floor" in sections:  # first: issue 24's ratios, before other sections fill Redis
                figures["floor"] = await bench_floor.floor_section(
                    server.url, str(server.socket), seconds, rounds, out)
            if "bus" in sections:  # first: before the 100k-entry fill grows Redis and its AOF
                figures["bus"] = await bench_bus.bus_section(server.url, str(server.socket),
                                                             seconds, rounds, out)
            if "acl" in sections:  # two services on this Redis, one per auth mode
                figures["acl"] = await bench_acl.acl_section(server.url, str(server.socket),
                                                             seconds, rounds, out)
            if "shards" in sections:  # two services on this Redis: 1 and 3 bus shards
                figures["shards"] = await bench_shards.shards_section(server.url, seconds,
                                                                      rounds, out)
            if "bounds" in sections:  # fresh servers of its own: their memory is a figure
                figures["bounds"] = await bench_bounds.bounds_section(out)
            if "dedupe" in sections:  # a fresh server of its own: its memory is the figure
                figures["dedupe"] = await bench_dedupe.dedupe_section(out)
            if "durability" in sections:  # two fresh servers of its own, one per mode
                figures["durability"] = await bench_durability.durability_section(
                    seconds, rounds, out)
            if "peers" in sections:  # its own servers: two Redis, an etcd, two NATS
                figures["peers"] = await bench_peers.peers_section(seconds, rounds, out)
            if "snapshot" in sections:  # its own servers: four Redis and a PostgreSQL
                figures["snapshot"] = await bench_snapshot.snapshot_section(seconds, rounds, out)
            if "cluster" in sections:  # its own servers: one redis-server and a 3+3 cluster
                figures["cluster"] = await bench_cluster.cluster_section(seconds, rounds, out)
            if "engines" in sections:
                figures["engines"] = await bench_engines.engines_section(
                    server.url, seconds, rounds, out)
            if "reactive" in sections:
                figures["reactive"] = await bench_reactive.reactive_section(
                    server.url, seconds, rounds, out)
            if "query" in sections:  # a 100k-entry scope of its own prefix
                figures["query"] = await bench_query.query_section(server.url, seconds, rounds,
                                                                   out)
            if "getmany" in sections:  # a service and a store of their own prefix
                figures["getmany"] = await bench_getmany.getmany_section(
                    server.url, seconds, rounds, out)
            if "http" in sections:  # two services of their own prefixes, HTTP off and on
                figures["http"] = await bench_http.http_section(server.url, seconds, rounds, out,
                                                                 server.pid)
            if "console" in sections:  # a service of its own prefix, 100k entries, chromium
                figures["console"] = await bench_console.console_section(server.url, rounds, out)
            if "msgpack" in sections:  # a service of its own prefix, a hand-written caller
                figures["msgpack"] = await bench_msgpack.msgpack_section(
                    server.url, str(server.socket), seconds, rounds, out)
            if "txn" in sections:  # a service and a store of their own prefix
                figures["txn"] = await bench_txn.txn_section(server.url, seconds, rounds, out)
            if sections & {"store", "update", "list"}:
                figures.update(await _measure(server.url, str(server.socket), seconds, rounds,
                                              out, sections))
            return figures
        finally:
            await server.stop()


async def _measure(url: str, socket: str, seconds: float, rounds: int, out: Any,
                   sections: set[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {"results": []}
    raw_client = aredis.Redis(unix_socket_path=socket)
    raw_set = raw_client.register_script(RAW_SET_LUA)
    value = msgspec.json.encode({"n": 1, "name": "bench", "tags": ["a", "b"], "ok": True})

    async def raw_op(w: int, i: int) -> Any:
        return await raw_set(keys=[f"raw:{{b}}:{w}", "raw:{b}:events"], args=[value, i])

    async with StateStore.open(url, prefix="bench", reaper=False) as store:
        for w in range(64):
            await store.set("bench", f"cas{w}", 0)

        async def ours_set(w: int, i: int) -> Any:
            return await store.call_json(
                "state::set", b'{"scope":"bench","key":"k%d","value":%s}' % (w, value))

        async def ours_get(w: int, i: int) -> Any:
            return await store.call_json("state::get", b'{"scope":"bench","key":"k%d"}' % w)

        counters = [0] * 64  # each worker swaps its own counter, so every swap is a hit

        async def ours_cas(w: int, i: int) -> Any:
            n = counters[w]
            counters[w] = n + 1
            body = b'{"scope":"bench","key":"cas%d","expected":%d,"value":%d}' % (w, n, n + 1)
            return await store.call_json("state::compare-and-set", body)

        print(f"{'operation':<28}{'conc':>5}{'ours ops/s':>13}{'raw ops/s':>13}{'ratio':>8}",
              file=out)

        def report(name: str, concurrency: int, ours_rate: float, raw_rate: float) -> None:
            ratio = ours_rate / raw_rate
            figures["results"].append({"op": name, "concurrency": concurrency,
                                       "ours": round(ours_rate), "raw": round(raw_rate),
                                       "ratio": round(ratio, 3)})
            print(f"{name:<28}{concurrency:>5}{ours_rate:>13,.0f}{raw_rate:>13,.0f}"
                  f"{ratio:>8.2f}", file=out)

        for name, ours in (("set", ours_set), ("get", ours_get),
                           ("compare-and-set", ours_cas)):
            for concurrency in (1, 64):
                if "store" not in sections:
                    continue
                ours_rate, raw_rate = await paired(ours, raw_op, concurrency, seconds, rounds)
                report("state::" + name, concurrency, ours_rate, raw_rate)
        if "update" in sections:
            await _update_section(store, raw_set, value, seconds, rounds, report)
        if "list" in sections:
            await _list_section(store, raw_client, seconds, rounds, report, out)
    await raw_client.aclose()
    print("raw = redis-py EVALSHA of a minimal HSET+XADD script, one awaited call per op "
          "(update: with the same 1 KiB document); list-entries raw = ZRANGE then a pipeline of "
          "100 HMGET, awaited per page", file=out)
    by_op = {(r["op"], r["concurrency"]): r["ours"] for r in figures["results"]}
    update = by_op.get(("state::update 3 ops 1KiB", 64))
    for label, other, how in (
            ("set_1KiB", by_op.get(("state::set 1KiB", 64)), "set 1 KiB, in alternation"),
            ("set_small", by_op.get(("state::set (beside update)", 64)),
             "set (small value), in alternation"),
            ("set_small_row", by_op.get(("state::set", 64)), "the state::set row above")):
        if update and other:
            figures[f"update_vs_{label}_64"] = round(update / other, 3)
            print(f"update / {how} (concurrency 64): {update / other:.2f}", file=out)
    return figures


def _document() -> bytes:
    """A 1 KiB JSON object: counters, strings, a nested list."""
    doc: dict[str, Any] = {"count": 0, "total": 0, "name": "bench", "tags": []}
    i = 0
    while len(msgspec.json.encode(doc)) < 1000:
        doc[f"field{i:03d}"] = {"n": i, "label": f"value-{i}", "ok": i % 2 == 0}
        i += 1
    return msgspec.json.encode(doc)


async def _update_section(store: StateStore, raw_set: Any, small: bytes, seconds: float,
                          rounds: int, report: Callable[[str, int, float, float], None]) -> None:
    """update, set of the same 1 KiB document, set of the small value and raw, in alternation:
    the update ratios compare rates measured side by side."""
    doc = _document()
    ops = (b'[{"type":"increment","path":"count","by":1},'
           b'{"type":"increment","path":"total","by":7},'
           b'{"type":"set","path":"name","value":"updated"}]')

    async def ours_update(w: int, i: int) -> Any:
        return await store.call_json(
            "state::update", b'{"scope":"bench","key":"doc%d","ops":%s}' % (w, ops))

    async def ours_set(w: int, i: int) -> Any:
        return await store.call_json(
            "state::set", b'{"scope":"bench","key":"doc%d","value":%s}' % (w, doc))

    async def ours_set_small(w: int, i: int) -> Any:
        return await store.call_json(
            "state::set", b'{"scope":"bench","key":"k%d","value":%s}' % (w, small))

    async def raw_op(w: int, i: int) -> Any:
        return await raw_set(keys=[f"raw:{{b}}:doc{w}", "raw:{b}:events"], args=[doc, i])

    for w in range(64):
        await ours_set(w, 0)
    rates: dict[str, list[float]] = {"update": [], "set": [], "small": [], "raw": []}
    for _ in range(rounds):
        for name, op in (("update", ours_update), ("set", ours_set),
                         ("small", ours_set_small), ("raw", raw_op)):
            rates[name].append((await timed(op, 64, seconds))[0])
    raw_rate = statistics.median(rates["raw"])
    report("state::update 3 ops 1KiB", 64, statistics.median(rates["update"]), raw_rate)
    report("state::set 1KiB", 64, statistics.median(rates["set"]), raw_rate)
    report("state::set (beside update)", 64, statistics.median(rates["small"]), raw_rate)


async def _list_section(store: StateStore, raw_client: Any, seconds: float, rounds: int,
                        report: Callable[[str, int, float, float], None], out: Any) -> None:
    scope, count = "bench-list", 100_000
    print(f"filling a scope with {count:,} entries ...", file=out, flush=True)
    async def writer(start: int) -> None:
        for i in range(start, count, 64):
            await store.call_json("state::set", b'{"scope":"%s","key":"k%06d","value":{"n":%d}}'
                                  % (scope.encode(), i, i))

    async with anyio.create_task_group() as tg:
        for start in range(64):
            tg.start_soon(writer, start)
    part = store.state.keys.for_scope(scope)
    index, entry_prefix = part.key_index(scope), part.entry_prefix + f"{len(scope)}:{scope}"
    body = b'{"scope":"%s","limit":100,"include_values":true}' % scope.encode()

    async def ours_page(w: int, i: int) -> Any:
        return await store.call_json("state::list-entries", body)

    async def raw_page(w: int, i: int) -> Any:
        keys = await raw_client.zrange(index, 0, 99)
        async with raw_client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hmget(entry_prefix + key.decode(), "v", "n", "h", "t", "c", "u", "x", "b")
            return await pipe.execute()

    for concurrency in (1, 8):
        ours_rate, raw_rate = await paired(ours_page, raw_page, concurrency, seconds, rounds)
        report("state::list-entries 100", concurrency, ours_rate, raw_rate)


SECTIONS = ("store", "update", "list", "bus", "acl", "shards", "dedupe", "durability", "snapshot",
            "reactive", "engines", "cluster", "getmany", "txn", "query", "floor", "http", "console",
            "msgpack", "bounds", "peers")


def main(seconds: float = 2.0, rounds: int = 3, sections: tuple[str, ...] = SECTIONS) -> None:
    figures = run_loop(run, seconds, rounds, sys.stdout, set(sections))
    print(msgspec.json.encode(figures).decode())
