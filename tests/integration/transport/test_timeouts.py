"""Connect and read timeouts of the Redis connection, against real sockets and a real Redis:
a listener that never answers, a proxy that turns into a black hole and back, a listener
whose accept queue is full (a connect that hangs), and blocking commands that wait longer
than the read timeout on purpose."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import anyio
import pytest
import redis.asyncio as aredis
from anyio.abc import SocketAttribute, SocketStream

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, Unavailable
from stateworker.settings import Settings
from stateworker.state.core.store import RedisState
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost
from tests.integration.busproto import until
from tests.servers import BUSY_SCRIPT, RedisServer

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.5
HANG_BOUND_S = 5 * TIMEOUT_S  # a bound on a hang, not a measure of speed


@asynccontextmanager
async def serving(handler: object) -> AsyncIterator[int]:
    """A TCP listener on 127.0.0.1 (a free port) serving `handler(stream)`; yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handler)  # type: ignore[arg-type]
        try:
            yield listener.extra(SocketAttribute.local_port)
        finally:
            tg.cancel_scope.cancel()


async def silent(stream: SocketStream) -> None:
    """Accept, read everything, answer nothing."""
    async with stream:
        with suppress(anyio.BrokenResourceError):  # the client aborted
            async for _ in stream:
                pass


class Proxy:
    """Forwards TCP to a real Redis; `forwarding = False` makes it a black hole: connections
    are still accepted and held, bytes in either direction are dropped."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.forwarding = True
        self.accepted = 0

    async def handle(self, client: SocketStream) -> None:
        self.accepted += 1
        async with client, await anyio.connect_tcp("127.0.0.1", self.upstream_port) as upstream, \
                anyio.create_task_group() as tg:
            tg.start_soon(self._pump, client, upstream, tg.cancel_scope)
            tg.start_soon(self._pump, upstream, client, tg.cancel_scope)

    async def _pump(self, source: SocketStream, sink: SocketStream,
                    done: anyio.CancelScope) -> None:
        try:
            async for chunk in source:
                if self.forwarding:
                    await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        done.cancel()  # one side gone: the connection is over


async def failing_in_time(call: object, expected: type[BaseException]) -> tuple[BaseException, float]:
    """Await `call()`; it must raise `expected` before HANG_BOUND_S. The error and the time."""
    start = time.monotonic()
    with anyio.fail_after(HANG_BOUND_S), pytest.raises(expected) as caught:
        await call()  # type: ignore[operator]
    return caught.value, time.monotonic() - start


# ---- a server that accepts and never answers --------------------------------------------------

async def test_read_timeout_on_a_server_that_never_answers() -> None:
    async with serving(silent) as port:
        url = f"redis://127.0.0.1:{port}/0"
        conn = RedisConnection(url, read_timeout_s=TIMEOUT_S)
        try:
            error, took = await failing_in_time(lambda: conn.execute("PING"), ConnectionLost)
            assert f"no reply from Redis at {url} within 0.5 s" in str(error)
            assert took >= TIMEOUT_S * 0.9  # not failed by something else, earlier
            # A pipeline in flight fails alike, as does every command waiting together.
            async def pipelined() -> None:
                await conn.pipeline([["SET", "a", "1"], ["GET", "a"]])
            await failing_in_time(pipelined, ConnectionLost)
        finally:
            await conn.close()


async def test_state_call_fails_unavailable_on_a_server_that_never_answers(prefix: str) -> None:
    async with serving(silent) as port:
        url = f"redis://127.0.0.1:{port}/0"
        settings = Settings(redis_url=url, prefix=prefix, partitions=4, read_timeout_s=TIMEOUT_S)
        state = RedisState(settings, RedisConnection(url, read_timeout_s=settings.read_timeout_s))
        store = StateStore(state)
        try:
            error, _ = await failing_in_time(lambda: store.get("s", "k"), Unavailable)
            assert error.code == "UNAVAILABLE"  # type: ignore[attr-defined]
            assert "no reply from Redis" in str(error)
        finally:
            await state.close()


async def test_open_fails_in_time_on_a_server_that_never_answers(prefix: str) -> None:
    async with serving(silent) as port:
        async def open_store() -> None:
            async with StateStore.open(f"redis://127.0.0.1:{port}/0", prefix=prefix,
                                       read_timeout_s=TIMEOUT_S, reaper=False):
                pass
        error, _ = await failing_in_time(open_store, ConfigError)
        assert "no reply from Redis" in str(error)


# ---- a network that goes silent and comes back --------------------------------------------------

async def test_black_hole_then_recovery_without_reopening(redis_server: RedisServer,
                                                          prefix: str, scope: str) -> None:
    proxy = Proxy(redis_server.port)
    async with serving(proxy.handle) as port, StateStore.open(
            f"redis://127.0.0.1:{port}/0", prefix=prefix, partitions=4,
            read_timeout_s=TIMEOUT_S, reaper=False) as store:
        assert (await store.set(scope, "k", 1)).created
        assert proxy.accepted == 2  # the store's connection and its registry follower's

        proxy.forwarding = False  # a silent partition: the connection stays up, nothing passes
        error, _ = await failing_in_time(lambda: store.set(scope, "k", 2), Unavailable)
        assert "no reply from Redis" in str(error)

        proxy.forwarding = True
        with anyio.fail_after(HANG_BOUND_S):
            await store.set(scope, "k", 3)
            assert await store.get(scope, "k") == 3
        assert proxy.accepted >= 3  # the store reconnected on its own (its follower may too)


# ---- a connect that hangs -------------------------------------------------------------------

async def test_connect_timeout(prefix: str) -> None:
    # A listener that never accepts, with its accept queue full: Linux drops further SYNs, so
    # a connect stays in SYN_SENT. Fill the queue until a probe connect hangs (the probe
    # itself shows that this machine makes a connect hang).
    async with AsyncExitStack() as stack:
        listening = stack.enter_context(socket.socket())
        listening.bind(("127.0.0.1", 0))
        listening.listen(0)
        port = listening.getsockname()[1]
        hung = False
        for _ in range(16):
            with anyio.move_on_after(0.3):
                filler = await anyio.connect_tcp("127.0.0.1", port)
                await stack.enter_async_context(filler)
                continue
            hung = True
            break
        assert hung, "could not fill the accept queue of a listener: no connect hangs here"

        url = f"redis://127.0.0.1:{port}/0"
        conn = RedisConnection(url, connect_timeout_s=TIMEOUT_S)
        stack.push_async_callback(conn.close)
        error, took = await failing_in_time(lambda: conn.execute("PING"), ConnectionLost)
        assert f"cannot connect to Redis at {url} within 0.5 s" in str(error)
        assert took >= TIMEOUT_S * 0.9

        # Commands waiting for the same attempt fail with it; they do not each wait out a
        # connect timeout of their own one after the other (8 x 0.5 s).
        async def many() -> None:
            failures: list[BaseException] = []

            async def one() -> None:
                try:
                    await conn.execute("PING")
                except ConnectionLost as exc:
                    failures.append(exc)

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
            assert len(failures) == 8
            raise failures[-1]
        await failing_in_time(many, ConnectionLost)

        # At the state level: the store cannot be opened, and says why.
        async def open_store() -> None:
            async with StateStore.open(url, prefix=prefix, connect_timeout_s=TIMEOUT_S,
                                       reaper=False):
                pass
        error, _ = await failing_in_time(open_store, ConfigError)
        assert "within 0.5 s" in str(error)


# ---- blocking commands wait longer than the read timeout on purpose --------------------------

async def connections_received(raw: aredis.Redis) -> int:
    return int((await raw.info("stats"))["total_connections_received"])


async def test_blocking_commands_do_not_trip_the_read_timeout(redis_server: RedisServer,
                                                              raw: aredis.Redis,
                                                              prefix: str) -> None:
    read_timeout = 0.3
    conn = RedisConnection(redis_server.url, read_timeout_s=read_timeout)
    try:
        await conn.execute("XGROUP", "CREATE", f"{prefix}:stream", "g", "$", "MKSTREAM")
        before = await connections_received(raw)
        with anyio.fail_after(10):
            # Blocks of 3x the read timeout, as the runtime's reader and the client's
            # reply reader send them, come back empty rather than as a dead connection.
            assert await conn.execute("XREADGROUP", "GROUP", "g", "c", "COUNT", 16,
                                      "BLOCK", 900, "STREAMS", f"{prefix}:stream", ">") is None
            assert await conn.execute("BLMPOP", 1, 1, f"{prefix}:list", "LEFT",
                                      "COUNT", 10) is None
            # Waits add up when blocking commands are queued back to back on one connection.
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(conn.execute, "BLPOP", f"{prefix}:list", 0.5)
            # A wait of 0 is forever: no read timeout while it blocks. It is woken by a push
            # once the silence has lasted well past the read timeout.
            async with anyio.create_task_group() as tg:
                popped: list[object] = []

                async def pop() -> None:
                    popped.append(await conn.execute("BLPOP", f"{prefix}:list", 0))
                tg.start_soon(pop)
                await anyio.sleep(3 * read_timeout)  # silence longer than the read timeout
                await raw.lpush(f"{prefix}:list", "v")
            assert popped == [[f"{prefix}:list".encode(), b"v"]]
            # An idle connection (nothing in flight) is not timed out either.
            await anyio.sleep(2 * read_timeout)
            assert await conn.execute("PING") == b"PONG"
        assert await connections_received(raw) == before  # the same connection throughout
    finally:
        await conn.close()


async def test_slow_reply_after_an_idle_spell_is_no_timeout(redis_server: RedisServer) -> None:
    """The silence is counted from the command, not from the last reply before an idle spell:
    a reply that takes 0.3 s of a 0.5 s read timeout, sent 0.35 s after the previous reply
    (the watchdog armed then still pending), arrives."""
    conn = RedisConnection(redis_server.url, read_timeout_s=TIMEOUT_S)
    try:
        with anyio.fail_after(10):
            assert await conn.execute("PING") == b"PONG"
            await anyio.sleep(0.35)  # idle, less than the read timeout
            assert await conn.execute("EVAL", BUSY_SCRIPT, 0, 300) == 1  # Redis busy 0.3 s
    finally:
        await conn.close()


async def test_bus_with_a_read_timeout_below_its_blocking_waits(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """The service reads with XREADGROUP BLOCK and the client with BLMPOP 1 s, both longer
    than a 0.2 s read timeout: calls after an idle second go through on the same connections."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        read_timeout_s=0.2)
    async with StateService.running(settings, BusOptions(block_ms=600)) as service, \
            StateClient(settings=settings) as client:
        with anyio.fail_after(10):
            await client.set(scope, "k", 1)
            # (the dispatcher's XREAD BLOCK 1 s too, once it holds its partitions)
            assert service.dispatcher is not None
            dispatcher = service.dispatcher
            await until(lambda: len(dispatcher.positions) == 4, 5, "the dispatcher reading")
            before = await connections_received(raw)
            await anyio.sleep(1.5)  # both readers block (and come back empty) meanwhile
            await client.set(scope, "k", 2)
            assert await client.get(scope, "k") == 2
        assert await connections_received(raw) == before


async def http(stream: SocketStream) -> None:
    """Answer whatever comes as an HTTP server would (not Redis)."""
    async with stream:
        with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            await stream.receive()
            await stream.send(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await stream.receive()


async def test_a_server_that_is_not_redis_is_named_not_a_crash(
        caplog: pytest.LogCaptureFixture) -> None:
    """A reply that is no RESP (an HTTP server at the URL): ConnectionLost saying so, at once,
    and no traceback from the event loop's transport ("Fatal error on transport")."""
    async with serving(http) as port:
        conn = RedisConnection(f"redis://127.0.0.1:{port}/0", connect_timeout_s=TIMEOUT_S,
                               read_timeout_s=TIMEOUT_S)
        try:
            with pytest.raises(ConnectionLost, match="does not speak the Redis protocol"):
                await conn.execute("PING")
        finally:
            await conn.close()
    assert not [r for r in caplog.records if "Fatal error" in r.getMessage()], caplog.text
