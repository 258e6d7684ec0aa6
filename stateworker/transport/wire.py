"""One socket's side of a Redis connection: the asyncio Protocol that matches replies to callers.

`RedisConnection` (connection.py) packs commands (hiredis, in C) into the protocol's output
buffer and decides when it is written; replies are parsed by hiredis and handed to the callers
in FIFO order, as RESP guarantees, a pipeline's replies to one future (one wake-up, not N).

Read timeout. A connection that has had replies outstanding for `read_timeout_s` without a
single byte arriving is declared dead (a silent partition, a server that accepts and never
answers): it is aborted, every command in flight fails with ConnectionLost and the next command
reconnects. That costs no timer per command: one watchdog timer per connection, armed while
anything is in flight, compares the time of the last bytes received with the clock.

Blocking commands wait legitimately: `RedisConnection.execute` reads the wait from the
command's own arguments (`blocking_wait`: XREAD / XREADGROUP `BLOCK <ms>`, BLMPOP / BZMPOP
`<timeout>`, BLPOP ... `<timeout>` last, WAIT) and lets the connection stay silent that much
longer; a wait of 0 (forever) suspends the read timeout until the reply comes. Derived from the
command rather than configured per connection, the allowance always matches the wait actually
asked for (the runtime's `BLOCK block_ms`, the client's `BLMPOP 1`) with no setting to keep in
step, costs the hot path one dict lookup per `execute` (`pipeline` looks at its first command
only: a blocking one may lead a pipeline, as a watch's wait leads its read), and a blocking
command on a shared connection also covers the replies queued behind it.
"""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Callable, Sequence
from typing import Any

import hiredis

Arg = bytes | str | int | float
# What Redis sends a connection past its `maxclients` (and closes it): no command ran.
MAXCLIENTS = "ERR max number of clients reached"


class ReplyError(Exception):
    """Raised when Redis answers a command with an error reply (`-ERR ...`)."""


class ConnectionLost(ConnectionError):
    """Raised for every command in flight when the connection to Redis breaks."""


def _text(arg: Arg) -> str:
    return arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)


def _seconds(value: Arg, scale: float) -> float:
    """A blocking command's wait in seconds; 0 means forever (inf). Not a number: no wait
    (Redis refuses the command at once)."""
    try:
        wait = float(value) * scale
    except (TypeError, ValueError):
        return 0.0
    return math.inf if wait == 0 else max(wait, 0.0)


def _xread_block(args: Sequence[Arg], first_option: int) -> float:
    """XREAD [COUNT n] [BLOCK ms] STREAMS ...; XREADGROUP GROUP g c [COUNT n] [BLOCK ms] ..."""
    for i in range(first_option, len(args) - 1):
        token = _text(args[i]).upper()
        if token == "BLOCK":
            return _seconds(args[i + 1], 0.001)
        if token == "STREAMS":
            break
    return 0.0  # no BLOCK: not a blocking read


_WAIT_OF: dict[str, Callable[[Sequence[Arg]], float]] = {
    "XREAD": lambda args: _xread_block(args, 1),
    "XREADGROUP": lambda args: _xread_block(args, 4),  # after GROUP <group> <consumer>
    "BLMPOP": lambda args: _seconds(args[1], 1.0),  # BLMPOP timeout numkeys key ...
    "BZMPOP": lambda args: _seconds(args[1], 1.0),
    "BLPOP": lambda args: _seconds(args[-1], 1.0),  # BLPOP key ... timeout
    "BRPOP": lambda args: _seconds(args[-1], 1.0),
    "BLMOVE": lambda args: _seconds(args[-1], 1.0),
    "BRPOPLPUSH": lambda args: _seconds(args[-1], 1.0),
    "BZPOPMIN": lambda args: _seconds(args[-1], 1.0),
    "BZPOPMAX": lambda args: _seconds(args[-1], 1.0),
    "WAIT": lambda args: _seconds(args[2], 0.001),  # WAIT numreplicas timeout-ms
    "WAITAOF": lambda args: _seconds(args[3], 0.001),  # WAITAOF numlocal numreplicas ms
}
# The command name as callers spell it (str or bytes, upper or lower case) -> its wait.
BLOCKING: dict[Arg, Callable[[Sequence[Arg]], float]] = {}
for _name, _wait in _WAIT_OF.items():
    for _spelling in (_name, _name.lower()):
        BLOCKING[_spelling] = BLOCKING[_spelling.encode()] = _wait


def blocking_wait(args: Sequence[Arg]) -> float:
    """How long a blocking command may keep Redis silent (seconds; inf: forever)."""
    try:
        return BLOCKING[args[0]](args)
    except IndexError:  # too few arguments: Redis refuses it at once
        return 0.0


def encode_command(args: Sequence[Arg], out: bytearray) -> None:
    """Append one command in RESP (hiredis packs it in C: ~3x faster than doing it here)."""
    out += hiredis.pack_command(tuple(args))  # type: ignore[arg-type]  # stub wants a 1-tuple


class Batch:
    """The replies of one pipeline, collected for a single future (one wake-up, not N)."""

    __slots__ = ("expected", "future", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], expected: int) -> None:
        self.future = future
        self.expected = expected
        self.replies: list[Any] = []


class RespProtocol(asyncio.Protocol):
    """One socket: the output buffer, the callers waiting in reply order, the read timeout."""

    def __init__(self, url: str, read_timeout_s: float | None) -> None:
        self.url = url
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(replyError=ReplyError)
        self.waiting: collections.deque[asyncio.Future[Any] | Batch] = collections.deque()
        self.out = bytearray()
        self.flush_scheduled = False
        self.closed: Exception | None = None
        # The read timeout's watchdog (see the module docstring). Times are loop.time().
        self.loop = asyncio.get_running_loop()
        self.read_timeout_s = read_timeout_s
        self.last_read = 0.0  # the last bytes received, or when the connection stopped idling
        self.quiet_until = 0.0  # a blocking command in flight may keep Redis silent until then
        self.watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a uvloop transport is one too

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self.reader.feed(data)
        waiting = self.waiting
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:  # not Redis at the other end (an HTTP server)
                self.fail(ConnectionLost(f"{self.url} does not speak the Redis protocol: {exc}"))
                if self.transport is not None:
                    self.transport.abort()
                return
            if reply is False:
                if not waiting:  # nothing in flight: no blocking command to make room for
                    self.quiet_until = 0.0
                return
            if isinstance(reply, ReplyError) and str(reply).startswith(MAXCLIENTS):
                # Redis's refusal of the connection itself, sent unasked as it accepts one
                # past `maxclients` (then it closes): not the first command's answer, and
                # worth another try later (transient), as a connection refused is.
                self.fail(ConnectionLost(
                    f"Redis refused a new connection: it holds its maxclients connections "
                    f"already ({reply}; docs/security.md, \"Redis's connections are "
                    "shared\")"))
                if self.transport is not None:
                    self.transport.abort()
                return
            future = waiting.popleft()
            if isinstance(future, Batch):
                future.replies.append(reply)  # an error reply stays in its place
                if len(future.replies) == future.expected and not future.future.done():
                    future.future.set_result(future.replies)
                continue
            if future.done():  # its caller was cancelled; the reply is dropped
                continue
            if isinstance(reply, ReplyError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(ConnectionLost(f"connection to Redis lost: {exc or 'closed'}"))

    def fail(self, error: ConnectionLost) -> None:
        """The connection is done for: every command in flight fails with `error` (the first
        reason given stays the connection's)."""
        if self.closed is None:
            self.closed = error
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        while self.waiting:
            item = self.waiting.popleft()
            future = item.future if isinstance(item, Batch) else item
            if not future.done():
                future.set_exception(self.closed)

    # ---- read timeout --------------------------------------------------------------------
    def start_waiting(self) -> None:
        """A command is queued while none was in flight: the wait for a reply starts now."""
        self.last_read = self.loop.time()
        if self.watchdog is None and self.read_timeout_s is not None:
            self.watchdog = self.loop.call_later(self.read_timeout_s, self.check)

    def allow_wait(self, seconds: float) -> None:
        """A blocking command was sent: Redis may rightly stay silent `seconds` longer
        (blocking commands queued back to back wait one after the other, so waits add up)."""
        now = self.loop.time()
        self.quiet_until = max(self.quiet_until, now) + seconds

    def check(self) -> None:
        """The watchdog: runs while replies are outstanding, at most every read timeout."""
        self.watchdog = None
        timeout = self.read_timeout_s
        if not self.waiting or self.closed is not None or timeout is None:
            return  # idle or gone: the next command queued re-arms it
        now = self.loop.time()
        silent_since = max(self.last_read, self.quiet_until)
        if now - silent_since >= timeout:
            self.fail(ConnectionLost(f"no reply from Redis at {self.url} within {timeout:g} s"))
            if self.transport is not None:
                self.transport.abort()  # not close(): that would wait to write out the buffer
            return
        # Next look when the silence would reach the timeout (a blocking wait: in one timeout).
        self.watchdog = self.loop.call_at(min(silent_since, now) + timeout, self.check)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and self.closed is None:
            self.transport.write(bytes(self.out))
        self.out.clear()

    def end_tick(self) -> None:
        """Write what the rest of this tick queued; the next command starts a new tick."""
        self.flush()
