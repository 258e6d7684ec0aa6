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
  sets no bound: `_BoundedHead` refuses one past MAX_HEAD_BYTES, as h11's limit did under
  Hypercorn; and it sends what a pass of the loop wrote as one (`OneWrite`);
- uvicorn waits for a request's head for ever (its keep-alive timeout runs only between
  requests), so a client trickling heads could hold connections without end: a head not
  complete HEAD_TIMEOUT_S after its first byte (not counting the time a request before it
  on the connection still runs: the server's) gets 408 and a close, and a connection that
  sends nothing for HEAD_TIMEOUT_S after it opened is closed (as an idle kept-alive one is);
  likewise a body none of which came for BODY_IDLE_S (between two pieces, as nginx's
  client_body_timeout counts), or not whole BODY_TOTAL_S after its head ended (a byte every
  few seconds would restart the idle time for ever): 408 and a close (the app's read of it
  ends: app/bodies.py);
- at most STATEWORKER_HTTP_MAX_CONNECTIONS connections, STATEWORKER_HTTP_MAX_CONNECTIONS_PER_CLIENT
  from one client address, counted as each is accepted (app/http_admission.py: a file
  descriptor each; uvicorn's `limit_concurrency` counted them only once a head had ended, so
  idle connections were held without bound), and as many requests in flight; beyond, 503
  UNAVAILABLE naming the limit, and a close;
- at most MAX_PIPELINED requests read ahead behind the one running on a connection, and none
  read while any waits (uvicorn parsed every request a read brought, and read again at each
  answer: one client pipelining `GET /healthz` grew the process by 150 MB a second); the
  one past them is answered 503 in its turn, and nothing after it is read;
- at most MAX_HEADERS header fields a request (each held as Python objects until it ends:
  64 KiB of empty fields took 1.5 MB and 12 ms of the loop); beyond, or past MAX_HEAD_BYTES,
  431 (414 for the request line) naming the limit, and a close;
- a response the client does not read: its sending waits (uvicorn's flow control) and held
  the connection and the response for good; nothing of it taken for SEND_IDLE_S: closed;
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

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stateworker.app.http_admission import REFUSING_S, Admission, Refusal, error_answer, refuse
from stateworker.app.http_flow import OneWrite, ReadAhead, SendWatch
from stateworker.errors import InvalidRequest, StateError, Unavailable

MAX_HEAD_BYTES = 64 * 1024  # a request line and its headers, together
KEEP_ALIVE_S = 5
HEAD_TIMEOUT_S = 10.0  # from a connection's opening or a request's first byte to its head's end
BODY_IDLE_S = 10.0  # the longest wait for the next piece of a request's body
BODY_TOTAL_S = 60.0  # from a request's head's end to its body's end
MAX_HEADERS = 100  # header fields a request (Apache's LimitRequestFields)
MAX_PIPELINED = 16  # requests read ahead behind the one running on a connection
SEND_IDLE_S = 10.0  # the longest a response's sending may wait on a client taking none of it
GRACE_S = 2  # requests in flight at a stop: then they are cancelled
BACKLOG = 1024


class _BoundedHead(HttpToolsProtocol):
    """uvicorn's httptools protocol, with its connections admitted within their limits, the
    head of each request bounded in size and in time, the requests read ahead and a response
    the client takes none of bounded, its writes made one a pass (`OneWrite`)."""

    _head = 0
    _fields = 0  # header fields of the request being read
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
    _admission: Admission | None = None  # the place taken (None: refused, or not yet)
    _client = ""
    _refusing: asyncio.TimerHandle | None = None  # a refused connection's close, REFUSING_S
    shut = False  # a request was refused in its turn: nothing after it is read
    _too_large: tuple[int, StateError] | None = None  # the head's refusal (`send_400_response`)
    sending: SendWatch  # a response's sending, closed once the client takes none of it
    _wire: OneWrite  # the transport uvicorn writes to

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        admission = cast(_Config, self.config).admission
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) else "?"
        refusal = admission.admit(client)
        if refusal is not None:
            self._refusing = refuse(transport, admission, refusal)
            return
        self._admission, self._client = admission, client
        self._wire = OneWrite(transport)
        super().connection_made(cast(asyncio.Transport, self._wire))
        self.flow = ReadAhead(self.transport, self)
        self.sending = SendWatch(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._admission is not None and not self.shut:  # (else dropped: see `shut`)
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refusing is not None:
            self._refusing.cancel()
            self._refusing = None
            cast(_Config, self.config).admission.refusing -= 1
        if self._admission is None:
            return  # (refused: nothing of uvicorn's was set up)
        self._admission.leave(self._client)
        self._admission = None
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.sending.resumed()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        if self.shut:
            return
        self._head = self._fields = 0
        self._await_head()  # (counted from the request's first byte)
        self._begun = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self.shut:
            return
        self._disarm()
        refusal = None
        if len(self.pipeline) >= MAX_PIPELINED:
            # Answered in its turn, after the requests before it; nothing after it is read
            # (its close ends the connection: the client sends the rest again, as HTTP/1.1
            # has a client do with requests a closed connection left unanswered).
            self._shut()
            refusal = Unavailable(
                f"at most {MAX_PIPELINED} requests may wait behind the one running on a "
                "connection (MAX_PIPELINED: docs/http.md); this one and those after it were "
                "not read: send them again", {"path": "pipeline", "limit": MAX_PIPELINED})
        elif len(self.tasks) >= cast(_Config, self.config).admission.limit:
            limit = cast(_Config, self.config).admission.limit
            # Nothing after it read (its 503 says the connection closes): read on, a request
            # the client sent behind it ran with its answer unsendable, and was sent again
            self._shut()
            refusal = Unavailable(
                f"the HTTP face runs at most {limit} requests at once "
                "(STATEWORKER_HTTP_MAX_CONNECTIONS): try again in a moment",
                {"path": "requests", "limit": limit})
        if refusal is not None:
            # the refusal's answer, in the request's place (the swap undone before any await)
            app, self.app = self.app, Refusal(refusal)
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()
        if self.shut:
            return
        self._body_by = self.loop.time() + BODY_TOTAL_S
        self._await_body()  # (ended at once by on_message_complete when there is none)

    def on_body(self, body: bytes) -> None:
        if self.shut:
            return
        self._await_body()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.shut:
            return
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            # (uvicorn resumed reading before it took the next request waiting: `ReadAhead`
            # refused while one waited; now that none may, read on)
            self.flow.resume_reading()

    def pause_writing(self) -> None:
        """The client takes the response slower than it comes (or not at all)."""
        if self._admission is not None:  # (a refused one has none of uvicorn's state)
            super().pause_writing()
            self.sending.paused(SEND_IDLE_S)

    def resume_writing(self) -> None:
        if self._admission is not None:
            super().resume_writing()
            self.sending.resumed()

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
        if self.shut:
            return
        self._grow(len(url), 414)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.shut:
            return
        self._grow(len(name) + len(value) + 4, 431)
        self._fields += 1
        if self._fields > MAX_HEADERS:
            self._too_big(431, InvalidRequest(
                f"a request may have at most {MAX_HEADERS} header fields (MAX_HEADERS: "
                "docs/http.md)", {"path": "headers", "limit": MAX_HEADERS}))
        super().on_header(name, value)

    def _grow(self, size: int, status: int) -> None:
        self._head += size
        if self._head > MAX_HEAD_BYTES:
            self._too_big(status, InvalidRequest(
                f"a request's line and headers may be at most {MAX_HEAD_BYTES} bytes "
                "(MAX_HEAD_BYTES: docs/http.md)", {"path": "headers" if status == 431 else
                                                  "url", "limit": MAX_HEAD_BYTES}))

    def _too_big(self, status: int, error: StateError) -> None:
        """Stop reading the head: raised in a parser callback, it ends in uvicorn's answer
        to a malformed request, `send_400_response`, which sends this instead."""
        self._too_large = (status, error)
        raise ValueError(str(error))

    def _shut(self) -> None:
        """Read no more requests on this connection: the one being read is the last one
        answered (a refusal), and its close lingers (http_flow.close_lingering)."""
        self.shut = True
        self.flow.pause_reading()
        self._wire.linger_s = REFUSING_S

    def send_400_response(self, msg: str) -> None:
        self._shut()  # (the parser stopped at an error: nothing after it can be read)
        if self._too_large is None:
            super().send_400_response(msg)
            return
        status, error = self._too_large
        self.transport.write(error_answer(status, error))
        self.transport.close()


class _Config(uvicorn.Config):
    """uvicorn's config, with the connections' admission its protocols share."""

    def __init__(self, app: Any, admission: Admission, **options: Any) -> None:
        super().__init__(app, **options)
        self.admission = admission


class ServerOnOurLoop(uvicorn.Server):
    """uvicorn's server, without the signal handlers it would install (the service's own)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def server_config(app: Any, admission: Admission) -> uvicorn.Config:
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # (not its start, its stop)
    return _Config(app, admission, http=_BoundedHead, ws="none", lifespan="off", loop="none",
                   log_config=None, access_log=False, proxy_headers=False,
                   server_header=False, timeout_keep_alive=KEEP_ALIVE_S,
                   timeout_graceful_shutdown=GRACE_S, backlog=BACKLOG)


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
