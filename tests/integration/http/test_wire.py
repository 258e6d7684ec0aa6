"""The HTTP face on the wire, below any client library: what the server in front of the app
(app/http.py, `serve_http`) must keep whichever it is. A body past the limit is refused and
the connection serves on; a malformed request line gets 400 and a close, a head past its
limit 431 (414: its line); a client that sends half a request holds up nobody else, and gets
408 and a close once its head is late or its body stalls; a connection is kept alive
across requests (HTTP/1.1) or closed after one (HTTP/1.0); and SIGTERM lets a request in
flight finish, then the process exits 0. (Connections and requests a hostile client holds:
test_connection_bounds.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import msgspec
import pytest

from stateworker.app import http_server
from stateworker.app.service import StateService
from tests.integration.busproto import until
from tests.integration.http.conftest import http_settings, serving
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

GET = b'{"scope":"wire","key":"k"}'


@pytest.fixture
async def face(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateService]:
    async with serving(http_settings(redis_server.url, prefix)) as (service, _):
        yield service


@asynccontextmanager
async def connection(address: str, source: str | None = None) -> AsyncIterator[Wire]:
    """A connection to the face at `address`, from the local address `source` (another
    loopback address, 127.0.0.2: another client) or the system's choice."""
    host, _, port = address.rpartition(":")
    async with await anyio.connect_tcp(host, int(port), local_host=source) as stream:
        yield Wire(stream, address)


class Wire:
    """One TCP connection to the face: requests written as bytes, answers read by their
    Content-Length."""

    def __init__(self, stream: anyio.abc.SocketStream, address: str) -> None:
        self.stream = stream
        self.address = address
        self.buffer = b""

    def head(self, path: str, length: int, method: str = "POST", version: str = "1.1") -> bytes:
        return (f"{method} {path} HTTP/{version}\r\nHost: {self.address}\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()

    async def call(self, fn: str, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        await self.stream.send(self.head(f"/v1/call/{fn}", len(body)) + body)
        return await self.answer()

    async def answer(self) -> tuple[int, dict[bytes, bytes], bytes]:
        with anyio.fail_after(30):
            while b"\r\n\r\n" not in self.buffer:
                self.buffer += await self.stream.receive()
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            status_line, *lines = head.split(b"\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in
                       (line.partition(b":") for line in lines)}
            length = int(headers.get(b"content-length", b"0"))
            while len(self.buffer) < length:
                self.buffer += await self.stream.receive()
            body, self.buffer = self.buffer[:length], self.buffer[length:]
            return int(status_line.split(b" ")[1]), headers, body

    async def trickle(self, pieces: Iterable[bytes], pause_s: float) -> None:
        """Each piece sent, then a pause (the client's own pace, the behaviour under test),
        until the pieces end or the server closes."""
        with contextlib.suppress(anyio.BrokenResourceError, OSError):
            for piece in pieces:
                await self.stream.send(piece)
                await anyio.sleep(pause_s)

    async def closed(self) -> bool:
        """Whether the server closes the connection (reading what else it sends)."""
        with anyio.fail_after(30):
            try:
                while await self.stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return True
        return False  # (unreachable: receive() never gives b"")


def code(body: bytes) -> str:
    return str(msgspec.json.decode(body)["error"]["code"])


async def test_a_body_past_the_limit_is_refused_and_the_connection_serves_on(
        face: StateService) -> None:
    assert face.http_address is not None
    limit = face.runtime.options.max_body_bytes
    async with connection(face.http_address) as wire:
        status, _, body = await wire.call("state::set", b"x" * (limit + 1))
        assert (status, code(body)) == (413, "VALUE_TOO_LARGE")
        status, _, body = await wire.call("state::get", GET)  # the same connection
        assert status == 200, body
        dapr = b'[{"key":"k","value":"' + b"x" * limit + b'"}]'
        await wire.stream.send(wire.head("/v1.0/state/statestore", len(dapr)) + dapr)
        status, _, body = await wire.answer()
        assert status == 413 and b"VALUE_TOO_LARGE" in body, body
        status, _, _ = await wire.call("state::get", GET)
        assert status == 200


@pytest.mark.parametrize("request_line", [b"NOT HTTP AT ALL\r\n\r\n",
                                          b"POST /v1/call/state::get HTTP/1.1\r\nno colon here\r\n\r\n",
                                          b"POST /v1/call/state::get HTTP/1.1\r\n"
                                          b"Content-Length: nine\r\n\r\n"])
async def test_a_malformed_request_gets_400_and_a_close(face: StateService,
                                                         request_line: bytes) -> None:
    assert face.http_address is not None
    async with connection(face.http_address) as wire:
        await wire.stream.send(request_line)
        status, _, _ = await wire.answer()
        assert status == 400
        assert await wire.closed()


async def test_a_head_past_its_limit_gets_400_and_a_close(face: StateService) -> None:
    """The request line and headers are held in memory until the head ends: a limit (64 KiB)
    keeps a client from making the service hold more."""
    assert face.http_address is not None
    async with connection(face.http_address) as wire:
        await wire.stream.send(b"GET /healthz HTTP/1.1\r\nHost: " + wire.address.encode()
                               + b"\r\n" + b"X-Filler: " + b"y" * 70_000 + b"\r\n\r\n")
        status, _, body = await wire.answer()
        error = msgspec.json.decode(body)["error"]
        assert (status, error["code"], error["details"]) == (
            431, "INVALID_REQUEST", {"path": "headers", "limit": http_server.MAX_HEAD_BYTES})
        assert await wire.closed()
    async with connection(face.http_address) as wire:  # a long URL too
        await wire.stream.send(b"GET /healthz?" + b"q" * 70_000 + b" HTTP/1.1\r\n\r\n")
        status, _, body = await wire.answer()
        assert (status, msgspec.json.decode(body)["error"]["details"]["path"]) == (414, "url")
        assert await wire.closed()


async def test_a_slow_client_holds_up_nobody_else(face: StateService) -> None:
    assert face.http_address is not None
    async with connection(face.http_address) as slow, connection(face.http_address) as other:
        request = slow.head("/v1/call/state::get", len(GET)) + GET
        await slow.stream.send(request[:20])  # half a request line
        for _ in range(5):
            status, _, _ = await other.call("state::get", GET)
            assert status == 200
        await slow.stream.send(request[20:-5])  # the head, and a body but its end
        for _ in range(5):
            status, _, _ = await other.call("state::get", GET)
            assert status == 200
        await slow.stream.send(request[-5:])
        status, _, body = await slow.answer()
        assert status == 200 and msgspec.json.decode(body)["ok"] is True


async def test_a_head_that_does_not_end_in_time_gets_408_and_a_close(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn alone would wait for a request's head for ever: a client trickling heads (or
    opening connections and sending nothing) could hold the face's connections without end."""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 0.5)
    assert face.http_address is not None
    async with connection(face.http_address) as slow, connection(face.http_address) as silent:
        request = slow.head("/v1/call/state::get", len(GET)) + GET
        await slow.stream.send(request[:20])  # half a request line, and no more
        status, headers, body = await slow.answer()
        assert status == 408 and headers[b"connection"] == b"close"
        assert body == b"the request's head did not end within 0.5 s"
        assert await slow.closed()
        assert await silent.closed()  # (nothing sent: closed, nothing answered)
        # A kept-alive connection's next request has its own time for its head.
        async with connection(face.http_address) as other:
            status, _, _ = await other.call("state::get", GET)
            assert status == 200
            await other.stream.send(request[:30])
            status, _, _ = await other.answer()
            assert status == 408 and await other.closed()


async def test_a_body_that_stalls_gets_408_and_a_close(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body none of which comes for a while (after its head, or between two pieces) ends
    its request: the client is told (408) and the connection closed; the call is not made. A
    body that keeps coming, however slowly, is read."""
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 1.0)
    assert face.http_address is not None
    put = b'{"scope":"wire","key":"stalled","value":1}'
    async with connection(face.http_address) as headed, \
            connection(face.http_address) as begun, connection(face.http_address) as steady:
        await headed.stream.send(headed.head("/v1/call/state::set", len(put)))
        await begun.stream.send(begun.head("/v1/call/state::set", len(put)) + put[:-5])
        await steady.stream.send(steady.head("/v1/call/state::get", len(GET)))
        for n in range(0, len(GET), 4):  # a piece every 0.2 s, 1.4 s in all: never idle 1 s
            await anyio.sleep(0.2)  # (the client's own pace, the behaviour under test)
            await steady.stream.send(GET[n:n + 4])
        status, _, _ = await steady.answer()
        assert status == 200
        for wire in (headed, begun):
            status, headers, body = await wire.answer()
            assert status == 408 and headers[b"connection"] == b"close"
            assert body == b"nothing of the request's body came for 1 s"
            assert await wire.closed()
    async with connection(face.http_address) as other:
        status, _, body = await other.call("state::get", b'{"scope":"wire","key":"stalled"}')
        assert status == 200 and msgspec.json.decode(body)["result"] is None


async def test_a_trickled_body_gets_408_when_its_whole_time_is_up(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte now and then restarts the idle time: the body as a whole has BODY_TOTAL_S
    from its head's end, so a trickling client cannot hold a connection for ever."""
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 1.0)
    monkeypatch.setattr(http_server, "BODY_TOTAL_S", 2.0)
    assert face.http_address is not None
    async with connection(face.http_address) as wire, anyio.create_task_group() as tg:
        await wire.stream.send(wire.head("/v1/call/state::set", 5_000_000))

        tg.start_soon(wire.trickle, itertools.repeat(b" "), 0.3)  # (never idle 1 s)
        status, headers, body = await wire.answer()
        tg.cancel_scope.cancel()
        assert status == 408 and headers[b"connection"] == b"close"
        assert body == b"the request's body did not end within 2 s"


async def test_a_head_trickled_a_byte_at_a_time_has_its_time_from_its_first_byte(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slowloris: each byte of a head keeps the connection busy but gives it no more time."""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 1.0)
    assert face.http_address is not None
    async with connection(face.http_address) as wire, anyio.create_task_group() as tg:
        request = wire.head("/v1/call/" + "a" * 400, len(GET)) + GET

        # (a byte every 0.1 s: the whole head would take 45 s)
        tg.start_soon(wire.trickle, (request[n:n + 1] for n in range(len(request))), 0.1)
        status, headers, body = await wire.answer()
        tg.cancel_scope.cancel()
        assert status == 408 and headers[b"connection"] == b"close"
        assert body == b"the request's head did not end within 1 s"


async def test_a_deadline_earlier_than_the_one_armed_is_kept(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """One timer a connection serves the head's and the body's deadlines: a body's deadline
    set while the timer waits for a later one (the head's, long) still falls in its time, as
    does the head's of a kept-alive connection's next request after a long body's."""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 3600.0)
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 0.5)
    assert face.http_address is not None
    async with connection(face.http_address) as wire:
        await wire.stream.send(wire.head("/v1/call/state::set", 10))  # and no body
        status, _, body = await wire.answer()
        assert (status, body) == (408, b"nothing of the request's body came for 0.5 s")
        assert await wire.closed()
    monkeypatch.setattr(http_server, "BODY_TOTAL_S", 0.5)  # (the whole body's, the same)
    async with connection(face.http_address) as wire:
        await wire.stream.send(wire.head("/v1/call/state::set", 10))
        status, _, body = await wire.answer()
        assert (status, body) == (408, b"the request's body did not end within 0.5 s")
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 3600.0)
    monkeypatch.setattr(http_server, "BODY_TOTAL_S", 3600.0)
    async with connection(face.http_address) as wire:
        head = wire.head("/v1/call/state::get", len(GET))
        await wire.stream.send(head)
        await anyio.sleep(1.0)  # (the client's own pace: the timer is armed for the body's hour)
        await wire.stream.send(GET)
        assert (await wire.answer())[0] == 200
        await wire.stream.send(head[:20])  # the next request: half a request line
        status, _, body = await wire.answer()
        assert (status, body) == (408, b"the request's head did not end within 0.5 s")


async def test_a_kept_alive_connection_outlives_its_last_requests_deadlines(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadlines of a request that ended do not fall on the idle connection after it:
    the next request, within the keep-alive time, is served."""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 0.5)
    monkeypatch.setattr(http_server, "BODY_TOTAL_S", 0.5)
    assert face.http_address is not None
    async with connection(face.http_address) as wire:
        for _ in range(2):
            status, headers, _ = await wire.call("state::get", GET)
            assert status == 200 and headers.get(b"connection") != b"close"
            await anyio.sleep(1.5)  # (the client's own pace: idle past every deadline, < 5 s)


def _armed() -> list[http_server._BoundedHead]:
    """The connections whose deadline timer is armed on the loop (the test's and the
    service's: one loop)."""
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    return [handle._callback.__self__ for handle in scheduled if not handle.cancelled()
            and getattr(handle._callback, "__func__", None) is http_server._BoundedHead._fire]


async def test_a_connection_closed_with_a_deadline_armed_leaves_no_timer(
        face: StateService, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection gone keeps no timer on the loop (nor the protocol it holds): none
    fires for a dead connection, and thousands of clients gone leave nothing behind."""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 3600.0)
    assert face.http_address is not None
    async with contextlib.AsyncExitStack() as stack:
        for n in range(3):
            wire = await stack.enter_async_context(connection(face.http_address))
            await wire.stream.send(wire.head("/v1/call/state::get", len(GET))[:10 + n * 40])
        await until(lambda: len(_armed()) == 3, 10, "the three connections' timers")
        connections = _armed()[0].connections  # (the server's set of open ones)
    await until(lambda: not connections, 10, "the server to see the connections go")
    assert _armed() == []


async def test_a_body_the_server_holds_up_is_not_a_stalled_one(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a request before it still runs, the server stops reading a pipelined request's
    body (uvicorn's flow control): that wait is the server's, not the client's, and is not
    refused however long it lasts. (Its own Redis, stopped with SIGSTOP for the while.)"""
    monkeypatch.setattr(http_server, "BODY_IDLE_S", 1.0)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        async with serving(http_settings(server.url, prefix)) as (face, _):
            assert face.http_address is not None and server.process is not None
            put = b'{"scope":"wire","key":"big","value":"%s"}' % (b"x" * 300_000)
            async with connection(face.http_address) as wire:
                first = wire.head("/v1/call/state::get", len(GET)) + GET
                second = wire.head("/v1/call/state::set", len(put)) + put
                os.kill(server.process.pid, signal.SIGSTOP)  # the first call waits on Redis
                try:
                    await wire.stream.send(first + second)
                    await anyio.sleep(3.0)  # (the time that passes is the test: 3 idle limits)
                finally:
                    os.kill(server.process.pid, signal.SIGCONT)
                assert (await wire.answer())[0] == 200
                status, _, body = await wire.answer()
                assert status == 200 and msgspec.json.decode(body)["ok"] is True
    finally:
        server.kill()


async def test_a_head_behind_a_request_the_server_still_runs_is_not_a_late_one(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipelined request's head, begun while the request before it still runs: the time
    that request takes is the server's, not the client's; a 408 then would reach the client
    as the answer to the request before (which ran). (Its own Redis, SIGSTOPped a while.)"""
    monkeypatch.setattr(http_server, "HEAD_TIMEOUT_S", 0.5)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        async with serving(http_settings(server.url, prefix)) as (face, _):
            assert face.http_address is not None and server.process is not None
            async with connection(face.http_address) as wire:
                first = wire.head("/v1/call/state::get", len(GET)) + GET
                second = wire.head("/v1/call/state::get", len(GET)) + GET
                os.kill(server.process.pid, signal.SIGSTOP)  # the first call waits on Redis
                try:
                    await wire.stream.send(first + second[:20])  # and half the next head
                    await anyio.sleep(2.0)  # (the time that passes is the test: 4 head limits)
                finally:
                    os.kill(server.process.pid, signal.SIGCONT)
                status, _, body = await wire.answer()
                assert status == 200 and msgspec.json.decode(body)["ok"] is True, body
                await wire.stream.send(second[20:])  # (the client's time starts after the hold)
                status, _, body = await wire.answer()
                assert status == 200 and msgspec.json.decode(body)["ok"] is True, body
    finally:
        server.kill()


async def test_a_connection_is_kept_alive_in_1_1_and_closed_after_1_0(
        face: StateService) -> None:
    assert face.http_address is not None
    async with connection(face.http_address) as wire:
        for _ in range(3):
            status, headers, _ = await wire.call("state::get", GET)
            assert status == 200 and headers.get(b"connection") != b"close"
    async with connection(face.http_address) as wire:
        await wire.stream.send(wire.head("/v1/call/state::get", len(GET), version="1.0") + GET)
        status, _, _ = await wire.answer()
        assert status == 200
        assert await wire.closed()


async def test_sigterm_lets_a_request_in_flight_finish(redis_server: RedisServer,
                                                       prefix: str) -> None:
    """A request whose body is still coming when SIGTERM arrives, and half a second after,
    gets its answer (requests in flight have 2 s); then the connection closes and the process
    exits 0."""
    service = ServiceProcess(redis_server.url, prefix, env={"STATEWORKER_HTTP": "127.0.0.1:0"})
    service.start()
    try:
        address = service.started["http"]
        body = b'{"scope":"wire","key":"k","value":1}'
        async with connection(address) as wire, connection(address) as idle:
            status, _, _ = await idle.call("state::get", GET)  # open, kept alive, idle
            assert status == 200
            await wire.stream.send(wire.head("/v1/call/state::set", len(body)) + body[:10])
            status, _, _ = await idle.call("state::get", GET)  # (the head is read by now)
            assert status == 200
            service.signal(signal.SIGTERM)
            assert await idle.closed()  # the server closes the idle one: it is stopping
            await anyio.sleep(0.5)  # (a pace, not a wait: still in flight well into the stop)
            await wire.stream.send(body[10:])
            status, _, answer = await wire.answer()
            assert status == 200 and msgspec.json.decode(answer)["ok"] is True, answer
            assert await wire.closed()
        assert service.wait() == 0
        with pytest.raises(httpx.ConnectError):  # nobody listens any more
            httpx.get(f"http://{address}/healthz")
    finally:
        service.kill()
