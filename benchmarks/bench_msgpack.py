"""The msgpack part of `stateworker bench` (issue 24, "msgpack bodies"): bus `state::set` and
`state::get` with a msgpack body (`fmt msgpack`) against the same calls in JSON, from one
hand-written caller (XADD, one reply list read with BLMPOP, replies matched by id: what a
program in another language does), 64 in flight, the two formats alternated each round. The
service's CPU per call beside each rate: a msgpack call is turned into JSON once, its reply
into msgpack, and the scripts that answer JSON calls themselves do not answer it."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import redis.asyncio as aredis

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import Op
from benchmarks.floor_process import stop_process, timed_cpu

PREFIX = "benchmp"
VALUE: dict[str, Any] = {"n": 1, "name": "bench", "tags": ["a", "b"], "ok": True}


class HandCaller:
    """Calls over the raw bus protocol: XADD on one connection, every reply popped from one
    list by a reader task (BLMPOP ... COUNT 1000) and handed to the call waiting for its id."""

    def __init__(self, socket_path: str, prefix: str) -> None:
        self.send_conn = aredis.Redis(unix_socket_path=socket_path)
        self.read_conn = aredis.Redis(unix_socket_path=socket_path)
        self.stream = f"{prefix}:bus:state"
        self.reply = f"{prefix}:reply:{uuid.uuid4().hex}"
        self.waiting: dict[bytes, tuple[anyio.Event, list[bytes]]] = {}
        self.ids = itertools.count()

    async def call(self, fn: str, body: bytes, fmt: str) -> bytes:
        call_id = f"h{next(self.ids)}".encode()
        done, out = anyio.Event(), list[bytes]()
        self.waiting[call_id] = (done, out)
        fields = {"id": call_id, "fn": fn, "body": body, "reply": self.reply}
        if fmt != "json":
            fields["fmt"] = fmt
        await self.send_conn.xadd(self.stream, fields)  # type: ignore[arg-type]
        await done.wait()
        return out[0]

    async def read(self) -> None:
        while True:
            popped: Any = await self.read_conn.blmpop(1, 1, self.reply, direction="LEFT",
                                                      count=1000)
            documents: list[bytes] = popped[1] if popped else []
            for document in documents:
                decode = msgspec.json.decode if document[:1] == b"{" else msgspec.msgpack.decode
                call_id = str(decode(document)["id"]).encode()
                done, out = self.waiting.pop(call_id)
                out.append(document)
                done.set()

    async def aclose(self) -> None:
        await self.send_conn.aclose()
        await self.read_conn.aclose()


@contextlib.asynccontextmanager
async def hand_caller(socket_path: str, prefix: str) -> AsyncIterator[HandCaller]:
    caller = HandCaller(socket_path, prefix)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller.read)
            yield caller
            tg.cancel_scope.cancel()
    finally:
        await caller.aclose()


def _op(caller: HandCaller, fn: str, fmt: str) -> Op:
    encode = msgspec.msgpack.encode if fmt == "msgpack" else msgspec.json.encode

    async def op(w: int, i: int) -> Any:
        body: dict[str, Any] = {"scope": f"s{w % 10}", "key": f"k{w}"}
        if fn == "state::set":
            body["value"] = VALUE
        return await caller.call(fn, encode(body), fmt)
    return op


async def msgpack_section(url: str, socket_path: str, seconds: float, rounds: int, out: Any
                          ) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    figures: dict[str, Any] = {}
    try:
        async with hand_caller(socket_path, PREFIX) as caller:
            for fn in ("state::set", "state::get"):
                rates: dict[str, list[float]] = {"json": [], "msgpack": []}
                cpus: dict[str, list[float]] = {"json": [], "msgpack": []}
                for fmt in rates:
                    await _op(caller, fn, fmt)(0, 0)  # warm up
                for _ in range(rounds):
                    for fmt in rates:
                        rate, _, cpu = await timed_cpu(_op(caller, fn, fmt), 64, seconds,
                                                       service.pid)
                        rates[fmt].append(rate)
                        cpus[fmt].append(cpu)
                figures[fn] = {fmt: {"ops_per_s": round(statistics.median(rates[fmt])),
                                     "service_cpu_us": round(statistics.median(cpus[fmt]) * 1e6,
                                                             1)} for fmt in rates}
    finally:
        stop_process(service)
    print("\nmsgpack bodies (fmt msgpack) vs JSON, bus, 64 in flight, one hand-written caller",
          file=out)
    print(f"{'call':<12}{'json/s':>9}{'msgpack/s':>11}{'ratio':>7}{'svc us json':>13}"
          f"{'svc us msgpack':>16}", file=out)
    for fn, by in figures.items():
        json_, packed = by["json"], by["msgpack"]
        ratio = packed["ops_per_s"] / json_["ops_per_s"] if json_["ops_per_s"] else 0.0
        by["ratio"] = round(ratio, 3)
        print(f"{fn:<12}{json_['ops_per_s']:>9,}{packed['ops_per_s']:>11,}{ratio:>7.2f}"
              f"{json_['service_cpu_us']:>13}{packed['service_cpu_us']:>16}", file=out)
    return figures
