"""The server in front of the HTTP face's app (app/http.py): uvicorn's HTTP/1.1 protocol on
httptools (llhttp, the parser of Node.js), run on the service's own event loop.

Why uvicorn with httptools (docs/decisions/0057): of the ASGI servers that run on a loop the
caller already runs, it costs the least CPU per request here: 21 us a keep-alive request of a
bare ASGI app, against Hypercorn's 114 (h11 in Python) and granian's embedded server's 32 (its
Rust runtime in a thread of its own, each request handed to the loop across threads).

What is set here, and why:
- the service owns SIGINT and SIGTERM (app/service.py): `ServerOnOurLoop` installs no
  handlers of its own, and stops when `should_exit` is set (app/http.py sets it on the
  service's stop);
- a request's head (request line and headers) is held in memory until it ends, and llhttp
  sets no bound: `_BoundedHead` refuses one past MAX_HEAD_BYTES (400 and a close), as h11's
  limit did under Hypercorn; and it sends what a pass of the loop wrote as one (`_OneWrite`);
- uvicorn waits for a request's head for ever (its keep-alive timeout runs only between
  requests), so a client trickling heads could hold connections without end: a head not
  complete HEAD_TIMEOUT_S after its first byte (not counting the time a request before it
  on the connection still runs: the server's) gets 408 and a close, and a connection that
  sends nothing for HEAD_TIMEOUT_S after it opened is closed (as an idle kept-alive one is);
  likewise a body none of which came for BODY_IDLE_S (between two pieces, as nginx's
  client_body_timeout counts), or not whole BODY_TOTAL_S after its head ended (a byte every
  few seconds would restart the idle time for ever): 408 and a close (the app's read of it
  ends: app/bodies.py);
- at most MAX_CONCURRENT connections and requests in flight (uvicorn's `limit_concurrency`:
  file descriptors and request tasks are the process's); a request beyond them is answered
  503 UNAVAILABLE and its connection closed;
- `proxy_headers` off: a client's `X-Forwarded-For` does not replace its address (the live
  tails' cap counts per client address in `off` mode);
- no `server` header, no access log (the service's own log lines say what matters), its
  logging left as the service set it up (`log_config=None`);
- keep-alive 5 s, the grace for requests in flight at a stop 2 s (Hypercorn's, before).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any, cast

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stateworker.errors import Unavailable

MAX_HEAD_BYTES = 64 * 1024  # a request line and its headers, together
KEEP_ALIVE_S = 5
HEAD_TIMEOUT_S = 10.0  # from a connection's opening or a request's first byte to its head's end
BODY_IDLE_S = 10.0  # the longest wait for the next piece of a request's body
BODY_TOTAL_S = 60.0  # from a request's head's end to its body's end
MAX_CONCURRENT = 1024  # connections open, and requests in flight, each (limit_concurrency)
GRACE_S = 2  # requests in flight at a stop: then they are cancelled
BACKLOG = 1024


class _OneWrite:
    """A connection's transport whose writes of one pass of the loop go out as one: uvicorn
    writes a response's head and its body apart, two sends a request (the client reads two
    segments). Measured on a bare ASGI app: 20 -> 17 us of the server's CPU a request, and 3 us
    less of the client's. Everything but `write` and `close` is the transport's own."""

    __slots__ = ("_parts", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self._flush)
        self._parts.append(data)

    def _flush(self) -> None:
        if self._parts:
            self._transport.write(b"".join(self._parts))
            self._parts.clear()

    def close(self) -> None:
        self._flush()  # (what was written goes before the close)
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _BoundedHead(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the head of each request bounded in size and in
    time, its writes made one a pass (`_OneWrite`)."""

    _head = 0
    # The head's or the body's deadline: when it falls (the loop's time) and what it does
    # then (None: no deadline). Set three times a request, so one timer serves them all,
    # fired at the earliest deadline it was armed for and armed again for a later one then
    # (a timer made and cancelled at each set cost ~5% of the service's CPU a call).
    _due = 0.0
    _at_due: Callable[[], None] | None = None
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0
    _begun = False  # a byte of a request came since the deadline was set
    _held = False  # the server held the request up when the deadline was last reached
    _body_by = 0.0  # the loop's time by which the body must have ended
    _whole = False  # the deadline set is the whole body's (BODY_TOTAL_S), not an idle one

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _OneWrite(transport)))
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._head = 0
        self._await_head()  # (counted from the request's first byte)
        self._begun = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._disarm()
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            # uvicorn's own answer is a bare "Service Unavailable": ours is the call API's
            # error document, naming the limit (the swap is undone before any await)
            app, self.app, self.limit_concurrency = self.app, _Busy(limit), None
            try:
                super().on_headers_complete()
            finally:
                self.app, self.limit_concurrency = app, limit
        else:
            super().on_headers_complete()
        self._body_by = self.loop.time() + BODY_TOTAL_S
        self._await_body()  # (ended at once by on_message_complete when there is none)

    def on_body(self, body: bytes) -> None:
        self._await_body()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _await_head(self) -> None:
        self._disarm()
        self._begun = False
        self._deadline(HEAD_TIMEOUT_S, self._head_late)

    def _await_body(self) -> None:
        self._disarm()
        left = self._body_by - self.loop.time()
        self._whole = left <= BODY_IDLE_S
        self._deadline(max(0.0, min(BODY_IDLE_S, left)), self._body_late)

    def _body_held(self) -> None:
        """The server held the body up: the client's whole time starts again after it."""
        self._body_by = self.loop.time() + BODY_TOTAL_S
        self._await_body()

    def _server_waits(self) -> bool:
        """Whether the server, not the client, holds the request up: uvicorn stopped reading
        (a request before it still runs, or the app has not read its body so far), or a
        `100 Continue` is not sent yet (uvicorn sends it when the app first reads)."""
        return bool(self.flow.read_paused or self.pipeline or (
            self.cycle is not None and self.cycle.waiting_for_100_continue))

    def _disarm(self) -> None:
        self._held = False
        self._at_due = None  # (an armed timer finds nothing to do)

    def _deadline(self, delay: float, then: Callable[[], None]) -> None:
        """`then` in `delay` seconds, unless disarmed or set again before."""
        self._due, self._at_due = self.loop.time() + delay, then
        if self._timer is None or self._timer_at > self._due:
            if self._timer is not None:
                self._timer.cancel()
            self._arm()

    def _arm(self) -> None:
        self._timer_at = self._due
        self._timer = self.loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._at_due is None:
            return
        if self.loop.time() < self._due:  # (set again since it was armed)
            self._arm()
            return
        then, self._at_due = self._at_due, None
        then()

    def _still_held(self, again: Callable[[], None], running: bool = False) -> bool:
        """At a deadline: while the server holds the request up (or `running`: the request
        before it still runs), and once more after its hold ended (the client's whole time
        starts then, not when the hold began), set the deadline `again` and say so."""
        held = running or self._server_waits()
        if not (held or self._held):
            return False
        again()
        self._held = held
        return True

    def _head_late(self) -> None:
        # A pipelined head begun while the request before it still runs (its response not
        # all sent) waits on the server: a 408 then would reach the client as that request's
        # answer (the request ran), and a close would lose it.
        cycle = self.cycle  # (the request before this one, if any)
        if self._still_held(self._rearm_head,
                            running=cycle is not None and not cycle.response_complete):
            return
        self._refuse(f"the request's head did not end within {HEAD_TIMEOUT_S:g} s"
                     if self._begun else None)

    def _rearm_head(self) -> None:
        self._deadline(HEAD_TIMEOUT_S, self._head_late)

    def _body_late(self) -> None:
        if self._still_held(self._body_held):
            return
        answered = self.cycle is not None and self.cycle.response_started  # (its own request's)
        self._refuse(None if answered else
                     f"the request's body did not end within {BODY_TOTAL_S:g} s" if self._whole
                     else f"nothing of the request's body came for {BODY_IDLE_S:g} s")

    def _refuse(self, message: str | None) -> None:
        """408 with `message`, and a close (None: the close alone, when no request began or
        a response is on its way: a 408 would land inside it, or after an answer)."""
        if self.transport.is_closing():
            return
        if message is not None:
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                % (len(message), message.encode()))
        self.transport.close()

    def on_url(self, url: bytes) -> None:
        self._grow(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _grow(self, size: int) -> None:
        self._head += size
        if self._head > MAX_HEAD_BYTES:  # (raised in a parser callback: uvicorn's 400)
            raise ValueError(f"a request head over {MAX_HEAD_BYTES} bytes")


class _Busy:
    """The answer to a request beyond MAX_CONCURRENT: 503, UNAVAILABLE, and a close."""

    def __init__(self, limit: int) -> None:
        self.body = msgspec.json.encode({"id": None, "ok": False, "error": {
            "code": Unavailable.code,
            "message": f"the HTTP face holds at most {limit} connections and requests in "
                       "flight (MAX_CONCURRENT): try again in a moment",
            "details": {"path": "connections", "limit": limit}}})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"content-length", str(len(self.body)).encode())]})
        await send({"type": "http.response.body", "body": self.body})


class ServerOnOurLoop(uvicorn.Server):
    """uvicorn's server, without the signal handlers it would install (the service's own)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server_config(app: Any) -> uvicorn.Config:
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # (not its start, its stop)
    return uvicorn.Config(app, http=_BoundedHead, ws="none", lifespan="off", loop="none",
                          log_config=None, access_log=False, proxy_headers=False,
                          server_header=False, timeout_keep_alive=KEEP_ALIVE_S,
                          timeout_graceful_shutdown=GRACE_S, backlog=BACKLOG,
                          limit_concurrency=MAX_CONCURRENT)


def listening(bind: str) -> socket.socket:
    """A TCP socket bound to `bind` (`host:port`, `[v6]:port`; port 0: any free one) and
    listening, so the port is known and a client may connect before serving starts."""
    host, _, port = bind.replace("[", "").replace("]", "").rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
