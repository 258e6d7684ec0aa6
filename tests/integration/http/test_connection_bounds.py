"""A hostile client against the HTTP face's shared connections, from the attacker's side,
while an honest one calls: what it may hold is bounded, and the honest caller is answered.

- connections are counted as they open (idle ones too: they hold a file descriptor each),
  in all and per client address; one beyond is answered 503 at once, naming its limit;
- the process's open-file limit bounds them too: a flood leaves the service the files it
  needs to reconnect to Redis (its own process, with its own `ulimit -n`);
- requests pipelined on a connection are read no faster than they are answered;
- a head of too many fields is refused, 431;
- a client that takes none of its answers is closed, and the answer dropped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis

from stateworker.app import http_server
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.http.conftest import http_settings, samples, serving
from tests.integration.http.test_wire import GET, Wire, connection
from tests.servers import RedisServer, ServiceProcess, tcp_quiet

pytestmark = pytest.mark.anyio

ATTACKER = "127.0.0.2"  # another loopback address: another client than the honest one's


def refusal(body: bytes) -> dict[str, Any]:
    error: dict[str, Any] = msgspec.json.decode(body)["error"]
    assert error["code"] == "UNAVAILABLE", error
    return error


async def test_idle_connections_past_the_limit_are_refused_as_they_open(
        redis_server: RedisServer, prefix: str) -> None:
    """Connections that send nothing count: before, the limit was counted once a head had
    ended, so 3,000 idle connections were all held (3,000 file descriptors)."""
    settings = http_settings(redis_server.url, prefix, http_max_connections=4)
    async with serving(settings) as (face, http), contextlib.AsyncExitStack() as held:
        assert face.http_address is not None
        idle = [await held.enter_async_context(connection(face.http_address, ATTACKER))
                for _ in range(4)]
        for _ in range(6):  # beyond: answered at once, though they sent nothing
            async with connection(face.http_address, ATTACKER) as over:
                status, headers, body = await over.answer()
                assert (status, headers[b"connection"]) == (503, b"close")
                error = refusal(body)
                assert error["details"] == {"path": "connections", "limit": 4}, error
                assert "STATEWORKER_HTTP_MAX_CONNECTIONS" in error["message"]
                assert await over.closed()
        for wire in idle:  # the places taken are still served
            assert (await wire.call("state::get", GET))[0] == 200
        await held.aclose()
        scraped = samples((await http.get("/metrics")).text)
        assert scraped[("stateworker_http_connections_refused_total", ())] == 6


async def test_one_client_cannot_take_every_connection(redis_server: RedisServer,
                                                       prefix: str) -> None:
    settings = http_settings(redis_server.url, prefix, http_max_connections=8,
                             http_max_connections_per_client=3)
    async with serving(settings) as (face, _), contextlib.AsyncExitStack() as held:
        assert face.http_address is not None
        refused = 0
        for _ in range(10):  # the attacker opens 10 and keeps what it gets
            wire = await held.enter_async_context(connection(face.http_address, ATTACKER))
            with anyio.move_on_after(0.2):  # (a place taken: no answer comes)
                status, _, body = await wire.answer()
                assert status == 503
                error = refusal(body)
                assert error["details"] == {"path": "connections", "limit": 3,
                                            "client": ATTACKER}, error
                refused += 1
        assert refused == 7
        async with contextlib.AsyncExitStack() as honest:  # its own three places
            for _ in range(3):
                wire = await honest.enter_async_context(connection(face.http_address))
                status, _, body = await wire.call("state::get", GET)
                assert status == 200, body


async def hang_up_after_calls(address: str, count: int) -> None:
    """`count` calls sent, each on a connection closed once the service has read it (their
    requests run on: a stopped Redis holds them in flight)."""
    port = int(address.split(":")[1])
    for _ in range(count):
        async with connection(address, ATTACKER) as wire:
            await wire.stream.send(wire.head("/v1/call/state::get", len(GET)) + GET)
            await until(lambda: tcp_quiet(port), 10, "the call to be read")


async def test_requests_whose_clients_hung_up_count_until_they_end(tmp_path: Path,
                                                                   prefix: str) -> None:
    """A request runs on after its client hangs up (its call waits on Redis): clients that
    send a call and close, again and again, free their connections but not the requests'
    tasks. Those count too: one beyond the limit is refused 503 (`requests`). (Its own
    Redis, stopped with SIGSTOP for the while.)"""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        settings = http_settings(server.url, prefix, http_max_connections=3)
        async with serving(settings) as (face, _):
            assert face.http_address is not None and server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)  # every call waits on Redis
            try:
                await hang_up_after_calls(face.http_address, 3)
                async with connection(face.http_address) as wire:  # a place is free ...
                    status, _, body = await wire.call("state::get", GET)
                    error = refusal(body)  # ... but not a request's
                    assert (status, error["details"]) == (
                        503, {"path": "requests", "limit": 3}), error
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
    finally:
        server.kill()


async def test_a_flood_leaves_the_service_the_files_it_needs(redis_server: RedisServer,
                                                             prefix: str) -> None:
    """At `ulimit -n` 256 the face holds 256 - 64 (tails) - 128 (FD_RESERVE) = 64
    connections: 300 opened at once leave the process files to reconnect to Redis after a
    blip, and the honest bus caller is answered. (Before, they took every file: the bus's
    reconnect failed with EMFILE, and nobody was served until the flood ended.)"""
    service = ServiceProcess(redis_server.url, prefix, files=256, env={
        "STATEWORKER_HTTP": "127.0.0.1:0",  # (one client may take them all: the files bind)
        "STATEWORKER_HTTP_MAX_CONNECTIONS_PER_CLIENT": "1024"})
    service.start()
    try:
        assert service.process is not None
        address = service.started["http"]
        host, _, port = address.rpartition(":")
        settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
        flood = []
        try:
            for _ in range(300):
                sock = socket.socket()
                sock.bind((ATTACKER, 0))
                sock.connect((host, int(port)))  # (the kernel's backlog takes it at once)
                flood.append(sock)
            fds = f"/proc/{service.process.pid}/fd"
            await until(lambda: len(os.listdir(fds)) > 64, 10, "the flood to be accepted")
            flood[-1].settimeout(10)
            first = flood[-1].recv(4096)  # (refused: its 503 is sent at once)
            assert b"503" in first.split(b"\r\n")[0] and b"ulimit -n" in first, first
            with redis.Redis(port=redis_server.port) as admin:  # a blip: the service's
                admin.client_kill_filter(_type="normal", skipme=True)  # connections cut
            # (answered within 5 s: the idle connections, were they all held, would be
            # closed after 10, HEAD_TIMEOUT_S, and the bus reconnect then)
            async with StateClient(settings=settings, timeout=5) as honest:
                await honest.call("state::set", {"scope": "s", "key": "k", "value": 1})
        finally:
            for sock in flood:
                sock.close()
    finally:
        service.kill()


async def test_pipelined_requests_are_read_no_faster_than_answered(face_settings: Settings
                                                                   ) -> None:
    """Before, every request a read brought was parsed and queued, and each answer read
    more: one client pipelining GET /healthz grew the service by 150 MB a second."""
    sent = 10_000
    async with serving(face_settings) as (face, http):
        assert face.http_address is not None
        async with connection(face.http_address, ATTACKER) as wire:
            request = f"GET /healthz HTTP/1.1\r\nHost: {face.http_address}\r\n\r\n".encode()
            async with anyio.create_task_group() as tg:
                tg.start_soon(wire.trickle, [request * sent], 0)
                answered = 0
                while True:
                    status, _, body = await wire.answer()
                    if status != 200:
                        break
                    answered += 1
            error = refusal(body)
            assert (status, error["details"]) == (
                503, {"path": "pipeline", "limit": http_server.MAX_PIPELINED}), error
            assert answered < sent // 10, answered
            assert await wire.closed()
        assert (await http.get("/healthz")).status_code == 200


async def test_a_head_of_too_many_fields_gets_431(face_settings: Settings) -> None:
    """Each field is held as Python objects until the request ends: 64 KiB of empty ones
    took 1.5 MB and 12 ms of the loop a request."""
    async with serving(face_settings) as (face, _):
        assert face.http_address is not None
        async with connection(face.http_address, ATTACKER) as wire:
            head = wire.head("/v1/call/state::get", len(GET))
            fields = b"".join(b"x-%d: 1\r\n" % n for n in range(http_server.MAX_HEADERS))
            await wire.stream.send(head[:-2] + fields + b"\r\n" + GET)
            status, _, body = await wire.answer()
            error = msgspec.json.decode(body)["error"]
            assert (status, error["details"]) == (
                431, {"path": "headers", "limit": http_server.MAX_HEADERS}), error
            assert await wire.closed()
        async with connection(face.http_address) as wire:  # at the limit: served
            fields = b"".join(b"x-%d: 1\r\n" % n for n in range(http_server.MAX_HEADERS - 2))
            head = wire.head("/v1/call/state::get", len(GET))  # (Host, Content-Length)
            await wire.stream.send(head[:-2] + fields + b"\r\n" + GET)
            assert (await wire.answer())[0] == 200


async def test_a_client_that_takes_no_answer_is_closed(
        face_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, it held its connection, and the answers it asked for, for good (200 such
    clients, each asking for four 1 MB values, held 586 MB)."""
    monkeypatch.setattr(http_server, "SEND_IDLE_S", 0.5)
    async with serving(face_settings) as (face, http):
        assert face.http_address is not None
        value = {"scope": "big", "key": "k", "value": "x" * 1_000_000}
        assert (await http.post("/v1/call/state::set", json=value)).status_code == 200
        host, _, port = face.http_address.rpartition(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (it reads nothing)
        sock.connect((host, int(port)))
        try:
            get = b'{"scope":"big","key":"k"}'
            wire = Wire(None, face.http_address)  # type: ignore[arg-type]  # (its head only)
            # 16 MB asked for: more than the kernel's buffers take (tcp_wmem: 4 MB)
            sock.sendall((wire.head("/v1/call/state::get", len(get)) + get) * 16)

            async def gone() -> bool:
                scraped = samples((await http.get("/metrics")).text)
                return scraped[("stateworker_http_connections", ())] <= 1  # (the scrape's)
            await until(gone, 10, "the connection that reads nothing to be closed")
        finally:
            sock.close()


@pytest.fixture
def face_settings(redis_server: RedisServer, prefix: str) -> Settings:
    return http_settings(redis_server.url, prefix)


async def test_nothing_is_read_after_a_request_refused_past_those_in_flight(
        tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 503 of a request past the requests in flight says the connection closes: a
    request the client sends after it (one pipelined behind it, in flight as the 503 came)
    is not read, so not run: run, its answer could not be sent (the sending side was shut),
    and the client, told nothing, sends it again on a new connection: it ran twice."""
    monkeypatch.setattr(http_server, "REFUSING_S", 30.0)  # (the lingering outlasts the test)
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        settings = http_settings(server.url, prefix, http_max_connections=3)
        async with serving(settings) as (face, http):
            assert face.http_address is not None and server.process is not None
            port = int(face.http_address.split(":")[1])
            os.kill(server.process.pid, signal.SIGSTOP)  # every call waits on Redis
            try:
                await hang_up_after_calls(face.http_address, 3)
                async with connection(face.http_address) as refused:
                    status, _, body = await refused.call("state::get", GET)
                    assert (status, refusal(body)["details"]["path"]) == (503, "requests")
                    os.kill(server.process.pid, signal.SIGCONT)  # the three end

                    async def served() -> bool:
                        async with connection(face.http_address) as probe:
                            return (await probe.call("state::get", GET))[0] == 200
                    await until(served, 10, "the requests in flight to end")
                    late = b'{"scope":"late","key":"k","value":1}'
                    with contextlib.suppress(anyio.BrokenResourceError, OSError):
                        await refused.stream.send(
                            refused.head("/v1/call/state::set", len(late)) + late)
                    await until(lambda: tcp_quiet(port), 10, "the late request to be taken")
                    assert await refused.closed()
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            got = await http.post("/v1/call/state::get", content=b'{"scope":"late","key":"k"}')
            assert got.status_code == 200, got.text
            assert msgspec.json.decode(got.content)["result"] is None, got.text
    finally:
        server.kill()
