"""The peers section's measured operations (benchmarks/bench_peers.py), one `Peer` per system:
its set, get and compare-and-set as bench `Op`s on the same value, its processes (for their
CPU) and a source of deliveries (a watch, and ours a trigger too) for the latency at 1,000
writes/s. Ours twice: over the bus, and over the HTTP face of the same service (no watch);
and both again on two replicas of a `strict` service (set and get).

Each worker w of an op owns key k<w> (set, get) and c<w> (compare-and-set), so every swap
names the version (etcd: the mod_revision; NATS: the revision) its worker's previous swap
returned and none fails; a failed one raises, so a wrong swap cannot pass for a fast one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec

from benchmarks.bench_bus import start_service
from benchmarks.bench_durability import PREFIX, Mode, durability_mode
from benchmarks.bench_http import KeepAlive
from benchmarks.bench_reactive import RATE, warmed, write_to_handler_latency
from benchmarks.benchtime import Op, paced, percentile
from benchmarks.floor_process import VALUE
from benchmarks.floor_strict import Server
from benchmarks.pgserver import free_port
from stateworker.events.model import Event

WORKERS = 64
Write = Callable[[int, bytes], Awaitable[Any]]  # (write number, value) -> awaitable
Deliveries = contextlib.AbstractAsyncContextManager[tuple[Write, AsyncIterator[bytes]]]


@dataclass
class Peer:
    ops: dict[str, Op]  # "set", "get", "cas"
    pids: dict[str, int]  # the processes serving it, by name
    # a watch of a fresh key prefix (by its tag) and its write (None: the ops alone)
    watch: Callable[[str], Deliveries] | None
    trigger: Callable[[float], Awaitable[dict[str, float]]] | None = None
    # closes its idle connections (None: it has none a server would close on a timer)
    idle: Callable[[], Awaitable[None]] | None = None


class _Versioned(msgspec.Struct):
    version: int


async def stateworker_peer(mode: Mode) -> Peer:
    """Bus calls through `mode`'s StateClient to its `stateworker serve`: set and get are the
    mode's own ops, compare-and-set a `state::set` with `expected_version`."""
    client = mode.client
    versions: dict[int, int] = {}

    async def cas(w: int, i: int) -> None:
        body = b'{"scope":"bench","key":"c%d","value":%s,"expected_version":%d}' % (
            w, VALUE, versions[w])
        reply = await client.call_json("state::set", body)
        versions[w] = msgspec.json.decode(reply, type=_Versioned).version

    for w in range(WORKERS):
        await mode["bus"](w, 0)  # the keys the gets read
        reply = await client.call_json(
            "state::set", b'{"scope":"bench","key":"c%d","value":%s}' % (w, VALUE))
        versions[w] = msgspec.json.decode(reply, type=_Versioned).version

    @contextlib.asynccontextmanager
    async def watch(tag: str) -> AsyncIterator[tuple[Write, AsyncIterator[bytes]]]:
        scope = f"lat{tag}".encode()

        async def write(i: int, value: bytes) -> Any:
            return await client.call_json(
                "state::set", b'{"scope":"%s","key":"k%d","value":%s}' % (scope, i % 100, value))

        async with client.watch(scope.decode()) as events:
            async def values() -> AsyncIterator[bytes]:
                async for item in events:
                    if isinstance(item, Event):  # not a Bookmark
                        yield bytes(item.new_value)

            yield write, values()

    async def trigger(seconds: float) -> dict[str, float]:
        return await write_to_handler_latency(client, client.settings, seconds)

    return Peer({"set": mode["bus"], "get": mode["bus_get"], "cas": cas}, _pids(mode), watch,
                trigger)


def _pids(mode: Mode) -> dict[str, int]:
    """The processes a call costs: the service and its Redis, and the bus's own Redis if any."""
    pids = {"service": mode.service.pid, "redis": mode.server.pid or 0}
    if mode.bus is not None:
        pids["bus redis"] = mode.bus.pid or 0
    return pids


async def http_peer(mode: Mode, address: str) -> Peer:
    """`mode`'s service through its HTTP face (`POST /v1/call/...`, one keep-alive connection
    per worker, bench_http.KeepAlive): set, get, and compare-and-set as the bus peer's, on
    keys of its own (h<w>, hc<w>). Its processes are the bus peer's: the same service."""
    clients = [KeepAlive(address) for _ in range(WORKERS)]
    versions: dict[int, int] = {}

    async def post(w: int, fn: str, body: bytes) -> bytes:
        status, reply = await clients[w].post(f"/v1/call/{fn}", body)
        if status != 200:
            raise RuntimeError(f"HTTP {fn}: {status} {reply!r}")
        return reply

    async def put(w: int, i: int) -> Any:
        return await post(w, "state::set",
                          b'{"scope":"bench","key":"h%d","value":%s}' % (w, VALUE))

    async def get(w: int, i: int) -> Any:
        return await post(w, "state::get", b'{"scope":"bench","key":"h%d"}' % w)

    async def cas(w: int, i: int) -> None:
        reply = await post(w, "state::set", b'{"scope":"bench","key":"hc%d","value":%s,'
                           b'"expected_version":%d}' % (w, VALUE, versions[w]))
        versions[w] = msgspec.json.decode(reply, type=_Reply).result.version

    for w in range(WORKERS):
        await put(w, 0)
        reply = await post(w, "state::set", b'{"scope":"bench","key":"hc%d","value":%s}' % (
            w, VALUE))
        versions[w] = msgspec.json.decode(reply, type=_Reply).result.version
    async def idle() -> None:
        for client in clients:  # (reopened by the next request)
            await client.aclose()

    return Peer({"set": put, "get": get, "cas": cas}, _pids(mode), None, idle=idle)


class _Reply(msgspec.Struct):
    result: _Versioned


async def replicas_peers(stack: contextlib.AsyncExitStack, directory: Path
                         ) -> tuple[Peer, Peer]:
    """`strict` on two replicas, one a core, started on `stack`: a service and its Redises
    (bench_durability's mode) and a second `stateworker serve` on the same two Redises, each
    with an HTTP face of its own. The bus peer's calls are served by both (one consumer
    group); the HTTP peer's workers alternate between the two faces (a load balancer's
    spread). Set and get only (a compare-and-set's version is each face peer's own)."""
    faces = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    mode = await stack.enter_async_context(durability_mode(
        directory, "strict", {"STATEWORKER_HTTP": faces[0]}, split_bus=True))
    assert mode.bus is not None
    replica = start_service(mode.server.url, PREFIX, {
        "STATEWORKER_DURABILITY": "strict", "STATEWORKER_HTTP": faces[1],
        "STATEWORKER_BUS_REDIS_URL": mode.bus.url})
    stack.callback(replica.wait, 30)
    stack.callback(replica.terminate)
    pids = {**_pids(mode), "replica": replica.pid}
    halves = [await http_peer(mode, face) for face in faces]

    def spread(op: str) -> Op:
        async def run(w: int, i: int) -> Any:
            return await halves[w % 2].ops[op](w, i)
        return run

    async def idle() -> None:
        for half in halves:
            assert half.idle is not None
            await half.idle()

    bus = Peer({"set": mode["bus"], "get": mode["bus_get"]}, pids, None)
    return bus, Peer({op: spread(op) for op in ("set", "get")}, pids, None, idle=idle)


async def etcd_peer(client: Any, server: Server) -> Peer:
    """aetcd: put, get (linearizable, etcd's default), a txn that puts when the key's
    mod_revision is the one expected."""
    revisions: dict[int, int] = {}

    async def put(w: int, i: int) -> Any:
        return await client.put(b"bench/k%d" % w, VALUE)

    async def get(w: int, i: int) -> Any:
        return await client.get(b"bench/k%d" % w)

    async def cas(w: int, i: int) -> None:
        key = b"bench/c%d" % w
        done, responses = await client.transaction(
            compare=[client.transactions.mod(key) == revisions[w]],
            success=[client.transactions.put(key, VALUE)], failure=[])
        if not done:
            raise RuntimeError(f"etcd txn on {key!r} failed")
        revisions[w] = responses[0].response_put.header.revision

    for w in range(WORKERS):
        await put(w, 0)
        revisions[w] = (await client.put(b"bench/c%d" % w, VALUE)).header.revision

    @contextlib.asynccontextmanager
    async def watch(tag: str) -> AsyncIterator[tuple[Write, AsyncIterator[bytes]]]:
        prefix = f"lat{tag}/".encode()
        events = await client.watch_prefix(prefix)

        async def write(i: int, value: bytes) -> Any:
            return await client.put(prefix + b"k%d" % (i % 100), value)

        async def values() -> AsyncIterator[bytes]:
            async for event in events:
                yield bytes(event.kv.value)

        try:
            yield write, values()
        finally:
            await events.cancel()

    return Peer({"set": put, "get": get, "cas": cas}, {"etcd": server.pid}, watch)


async def nats_peer(kv: Any, server: Server) -> Peer:
    """nats-py's KV: put, get, update with the last revision."""
    revisions: dict[int, int] = {}

    async def put(w: int, i: int) -> Any:
        return await kv.put(f"k{w}", VALUE)

    async def get(w: int, i: int) -> Any:
        return await kv.get(f"k{w}")

    async def cas(w: int, i: int) -> None:
        revisions[w] = await kv.update(f"c{w}", VALUE, last=revisions[w])

    for w in range(WORKERS):
        await put(w, 0)
        revisions[w] = await kv.put(f"c{w}", VALUE)

    @contextlib.asynccontextmanager
    async def watch(tag: str) -> AsyncIterator[tuple[Write, AsyncIterator[bytes]]]:
        prefix = f"lat{tag}."
        watcher = await kv.watch(prefix + ">")

        async def write(i: int, value: bytes) -> Any:
            return await kv.put(f"{prefix}k{i % 100}", value)

        async def values() -> AsyncIterator[bytes]:
            async for entry in watcher:
                if entry is not None:  # None: the end of what was there when it opened
                    yield bytes(entry.value)

        try:
            yield write, values()
        finally:
            await watcher.stop()

    return Peer({"set": put, "get": get, "cas": cas}, {"nats-server": server.pid}, watch)


async def delivery_latency(deliveries: Deliveries, seconds: float) -> dict[str, float]:
    """Writes paced at RATE/s for `seconds`, each value its send time; each delivery's
    arrival minus that time (p50/p99 ms), waiting up to 30 s for the last; after a first
    write delivered and not counted (`warmed`)."""
    delays: list[float] = []
    count = int(RATE * seconds)
    async with deliveries as (write, values):
        async def receive() -> None:
            async for value in values:
                delays.append(time.perf_counter() - msgspec.json.decode(value)["t"])

        async def send(i: int) -> None:
            await write(i, b'{"t":%r}' % time.perf_counter())

        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await warmed(send, delays)
            await paced(send, count, RATE)
            with anyio.move_on_after(30):
                while len(delays) < count:
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    return {"events": len(delays), "of": count,
            "p50_ms": round(percentile(delays, 0.5) * 1000, 3) if delays else -1.0,
            "p99_ms": round(percentile(delays, 0.99) * 1000, 3) if delays else -1.0}
