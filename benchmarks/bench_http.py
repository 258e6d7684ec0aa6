"""The HTTP face's cost (`scripts/bench --sections http`; issue 25): in one run, alternated,

1. bus `state::set` at 64 in flight through a service with the HTTP face on and `/metrics`
   scraped every 0.25 s, against the same through a service with it off (target >= 0.95);
2. `POST /v1/call/state::get` and `state::set` at 64 in flight (64 keep-alive connections
   of a lean client, `KeepAlive`) against bus `state::get` and `state::set` at 64 on the same
   service, with the service process's CPU per call of each (issue 43: HTTP at most 1.5x the
   bus's). The service is `fast` (the run's Redis); the peers section has `strict` beside etcd.

Both services are `stateworker serve` processes on the run's Redis, each on its own prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import anyio.abc
import httpx
import msgspec

from benchmarks.benchtime import timed
from benchmarks.floor_process import timed_cpus
from stateworker.bus.client import StateClient
from stateworker.settings import Settings

VALUE = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
SCRAPE_EVERY_S = 0.25


def serve(url: str, prefix: str, http: bool) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A `stateworker serve` and its start line (JSON), once it serves (within 30 s)."""
    env = {**os.environ, "STATEWORKER_PREFIX": prefix}
    args = [sys.executable, "-m", "stateworker", "--redis-url", url, "serve",
            "--log-level", "WARNING", *(["--http", "127.0.0.1:0"] if http else [])]
    process = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline() if ready else ""
    if '"serving"' not in line:
        process.kill()
        raise RuntimeError(f"the service did not start for the benchmark: {line!r}")
    return process, msgspec.json.decode(line)


class KeepAlive:
    """A lean HTTP/1.1 client: one keep-alive connection, one request at a time, the reply
    read by its Content-Length, on an asyncio protocol of its own (httpx cost this machine ~3
    ms of its own per request, 10x what the server takes: the figure would have been the
    client's; on anyio's socket streams it cost ~42 us a request, on a protocol ~20, the bus's
    client 22: the bench's callers share the machine's cores with the servers they measure)."""

    def __init__(self, address: str) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)
        self.conn: _Conn | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        try:
            return await self._post(path, body)
        except ConnectionError:  # closed while idle (keep-alive timeout, 5 s): once more
            await self.aclose()  # on a new connection
            return await self._post(path, body)

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.conn is None or self.conn.transport is None:
            loop = asyncio.get_running_loop()
            _, self.conn = await loop.create_connection(_Conn, self.host, self.port)
        # (Host: the address itself, a name the service answers to: app/hosts.py)
        return await self.conn.request(
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.port, len(body), body))

    async def aclose(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None


class _Conn(asyncio.Protocol):
    """KeepAlive's connection: the bytes received until a whole reply is there."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        cast(Any, transport.get_extra_info("socket")).setsockopt(
            socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None and self.waiter is None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = self.buffer[:end]
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        if len(self.buffer) < end + 4 + length:
            return
        reply, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
        waiter, self.waiter = self.waiter, None
        waiter.set_result((int(head.split(b" ", 2)[1]), reply))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionResetError("the server closed the connection"))
        self.waiter = None


@contextlib.asynccontextmanager
async def scraping(http: httpx.AsyncClient) -> AsyncIterator[list[int]]:
    """GET /metrics every SCRAPE_EVERY_S while the block runs; the scrapes' sizes."""
    sizes: list[int] = []
    async with anyio.create_task_group() as tg:
        async def scrape() -> None:
            while True:
                sizes.append(len((await http.get("/metrics")).content))
                await anyio.sleep(SCRAPE_EVERY_S)  # a pace, not a wait for something

        tg.start_soon(scrape)
        yield sizes
        tg.cancel_scope.cancel()


async def http_section(url: str, seconds: float, rounds: int, out: Any, redis_pid: int | None
                       ) -> dict[str, Any]:
    """The section; `redis_pid`: the run's Redis, whose CPU per call is counted with the
    service's (what a call costs the servers: an HTTP call does less in Redis, no stream)."""
    off, _ = serve(url, "benchhttpoff", http=False)
    on, line = serve(url, "benchhttpon", http=True)
    rates: dict[str, list[float]] = {"off": [], "on": [], "http_get": [], "bus_get": [],
                                     "http_set": [], "bus_set": []}
    cpus: dict[str, list[float]] = {f"{name}{part}": [] for name in ("http_get", "bus_get",
                                    "http_set", "bus_set") for part in ("", "_service")}
    pids = {"service": on.pid, **({"redis": redis_pid} if redis_pid else {})}
    scrapes = 0
    clients = [KeepAlive(line["http"]) for _ in range(64)]  # one connection per caller
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix="benchhttpoff")) as c_off, \
                StateClient(settings=Settings(redis_url=url, prefix="benchhttpon")) as c_on, \
                httpx.AsyncClient(base_url=f"http://{line['http']}", limits=httpx.Limits(
                    max_connections=64)) as web:
            def setter(client: StateClient) -> Any:
                async def op(w: int, i: int) -> Any:
                    return await client.call_json(
                        "state::set", b'{"scope":"s","key":"k%d","value":%s}' % (w, VALUE))
                return op

            async def bus_get(w: int, i: int) -> Any:
                return await c_on.call_json("state::get", b'{"scope":"s","key":"k%d"}' % w)

            async def http_get(w: int, i: int) -> Any:
                status, reply = await clients[w].post("/v1/call/state::get",
                                                      b'{"scope":"s","key":"k%d"}' % w)
                assert status == 200, reply
                return reply

            async def http_set(w: int, i: int) -> Any:
                status, reply = await clients[w].post(
                    "/v1/call/state::set", b'{"scope":"s","key":"k%d","value":%s}' % (w, VALUE))
                assert status == 200, reply
                return reply

            paths = {"bus_get": bus_get, "http_get": http_get, "bus_set": setter(c_on),
                     "http_set": http_set}

            await setter(c_off)(0, 0)
            await setter(c_on)(0, 0)
            for _ in range(rounds):
                rates["off"].append((await timed(setter(c_off), 64, seconds))[0])
                async with scraping(web) as sizes:
                    rates["on"].append((await timed(setter(c_on), 64, seconds))[0])
                scrapes += len(sizes)
                for name, op in paths.items():
                    rate, _, cpu = await timed_cpus(op, 64, seconds, pids)
                    rates[name].append(rate)
                    cpus[name].append(sum(v for k, v in cpu.items() if k != "caller") * 1e6)
                    cpus[f"{name}_service"].append(cpu["service"] * 1e6)
    finally:
        for client in clients:
            await client.aclose()
        for process in (off, on):
            process.terminate()
            process.wait(timeout=30)
    figures: dict[str, Any] = {name: round(statistics.median(values))
                               for name, values in rates.items()}
    figures["on_vs_off"] = round(figures["on"] / figures["off"], 3)
    figures["http_get_vs_bus_get"] = round(figures["http_get"] / figures["bus_get"], 3)
    figures["http_set_vs_bus_set"] = round(figures["http_set"] / figures["bus_set"], 3)
    figures["cpu_us"] = {name: round(statistics.median(values), 1) for name, values in cpus.items()}
    figures["scrapes"] = scrapes
    print(f"\n{'HTTP face (issue 25)':<46}{'ours':>9}  {'reference':<34}{'ref':>9}{'ratio':>7}"
          f"  target", file=out)
    print(f"{'bus set/s, 64, HTTP on + /metrics each 0.25 s':<46}{figures['on']:>9,}  "
          f"{'bus set/s, 64, HTTP off':<34}{figures['off']:>9,}{figures['on_vs_off']:>7.2f}"
          f"  >= 0.95", file=out)
    print(f"{'POST /v1/call/state::get/s, 64':<46}{figures['http_get']:>9,}  "
          f"{'bus state::get/s, 64':<34}{figures['bus_get']:>9,}"
          f"{figures['http_get_vs_bus_get']:>7.2f}  (measured)", file=out)
    print(f"{'POST /v1/call/state::set/s, 64':<46}{figures['http_set']:>9,}  "
          f"{'bus state::set/s, 64':<34}{figures['bus_set']:>9,}"
          f"{figures['http_set_vs_bus_set']:>7.2f}  (measured)", file=out)
    cpu = figures["cpu_us"]
    for op in ("get", "set"):  # (the service and Redis; then the service alone)
        for part, what, target in (("", "servers", "<= 1.5"), ("_service", "service", "")):
            http, bus = cpu[f"http_{op}{part}"], cpu[f"bus_{op}{part}"]
            print(f"{f'{what} CPU us per HTTP {op}, 64':<46}{http:>9.1f}  "
                  f"{f'per bus {op}, 64':<34}{bus:>9.1f}{http / bus:>7.2f}  {target}",
                  file=out)
    return figures
