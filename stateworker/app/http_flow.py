"""How the HTTP face's connections send and read (app/http_server.py): what one pass of the
loop wrote goes out as one write (`OneWrite`), and a connection reads on only while no
request waits behind the one running (`ReadAhead`)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.http.flow_control import FlowControl


class OneWrite:
    """A connection's transport whose writes of one pass of the loop go out as one: uvicorn
    writes a response's head and its body apart, two sends a request (the client reads two
    segments). Measured on a bare ASGI app: 20 -> 17 us of the server's CPU a request, and 3 us
    less of the client's. Everything but `write` and `close` is the transport's own;
    `linger_s` set, its close lingers (`close_lingering`)."""

    __slots__ = ("_parts", "_transport", "linger_s")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._parts: list[bytes] = []
        self.linger_s: float | None = None

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
        if self.linger_s is None:
            self._transport.close()
        else:
            close_lingering(self._transport, self.linger_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def close_lingering(transport: asyncio.Transport, seconds: float) -> asyncio.TimerHandle:
    """Close a connection whose client may still be sending (a refusal's): its sending side
    shut once what waits is sent, what the client sends meanwhile read (and dropped by the
    protocol), then closed when the client closes, or cut `seconds` later. Closed at once
    with bytes unread, the kernel resets it, and the reset drops what was still on its way
    to the client: the answers before the refusal, and the refusal itself (the client
    pipelining 10,000 requests read 2 answers of the 17 sent, not the 503). Apache's
    lingering close."""
    transport.write_eof()
    transport.resume_reading()
    return asyncio.get_running_loop().call_later(seconds, transport.abort)


class Reading(Protocol):
    """What `ReadAhead` asks of its connection's protocol."""

    @property
    def pipeline(self) -> Any: ...  # (uvicorn's deque of the requests waiting)

    @property
    def shut(self) -> bool: ...


class ReadAhead(FlowControl):
    """uvicorn's flow control, reading on only while no request waits behind the one running
    (uvicorn resumed at every answer and every read of a body: each resume one more read,
    parsed whole, its requests queued) and never once a request was refused in its turn."""

    def __init__(self, transport: asyncio.Transport, protocol: Reading) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if not (self._protocol.pipeline or self._protocol.shut):
            super().resume_reading()


class SendWatch:
    """A connection whose response waits on its client (the transport's buffer past its high
    mark: uvicorn's sending waits): closed once the client took none of it for `idle_s`,
    as nginx's send_timeout. Before, a client that read no answer held its connection and
    the answer for good (200 such, each sent four 1 MB values, held 586 MB)."""

    __slots__ = ("_timer", "_transport", "_unsent")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # what waited to be sent when the client last took some

    def paused(self, idle_s: float) -> None:
        self.resumed()
        self._unsent = self._transport.get_write_buffer_size()
        self._timer = asyncio.get_running_loop().call_later(idle_s, self._late, idle_s)

    def resumed(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _late(self, idle_s: float) -> None:
        unsent = self._transport.get_write_buffer_size()
        if unsent < self._unsent:  # (it takes some, however slowly)
            self.paused(idle_s)
            return
        self._timer = None
        self._transport.abort()  # (a close would wait to send what waits first)
