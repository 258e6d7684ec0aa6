"""`Subscriber`: one Redis channel's messages, on a connection of its own (SUBSCRIBE).

A bus client whose bus is on a Redis of its own gets the replies its calls' scripts answer
on the state's Redis this way (bus/client.py, docs/decisions/0059): a PUBLISH writes nothing
to the AOF, so a read's reply waits for no fsync, and a write's still leaves Redis only after
its turn's fsync, as every reply of that turn. Pub/sub keeps nothing for a subscriber that is
away: `live` says whether messages can arrive now, and `lost` runs when they may have been
missed (the connection broke), so the caller asks again for what it waits for.

A subscription that cannot be made is not an error of any call (each is answered on the bus
meanwhile), but it makes every call a hop slower: it is logged, once an outage (a warning at
its first failure, a line when subscribed again) and once when refused for good.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import hiredis

from stateworker.transport.connection import open_socket, shown_url
from stateworker.transport.retry import Backoff, transient_reason
from stateworker.transport.wire import (
    Arg,
    ConnectionLost,
    ReplyError,
    RespProtocol,
    encode_command,
)

MESSAGE = b"message"
PING_S = 2.0  # a live subscription's PING, so its read timeout can tell a dead path
KEPT_S = 5.0  # a subscription that lasted this long resets the backoff of its successor

log = logging.getLogger("stateworker.transport.subscriber")


class PushProtocol(RespProtocol):
    """A subscribed connection: a `message` push goes to `deliver`, any other reply to the
    command waiting for it (SUBSCRIBE's confirmation)."""

    def __init__(self, url: str, read_timeout_s: float | None,
                 deliver: Callable[[bytes], None]) -> None:
        super().__init__(url, read_timeout_s)
        self.deliver = deliver
        self.ended: asyncio.Future[None] = self.loop.create_future()

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self.reader.feed(data)
        while True:
            try:
                reply = self.reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(ConnectionLost(f"{self.url} does not speak the Redis protocol: {exc}"))
                if self.transport is not None:
                    self.transport.abort()
                return
            if reply is False:
                return
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == MESSAGE:
                self.deliver(reply[2])
            elif self.waiting:
                future = self.waiting.popleft()
                if isinstance(future, asyncio.Future) and not future.done():
                    if isinstance(reply, ReplyError):
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)

    def fail(self, error: ConnectionLost) -> None:
        super().fail(error)
        if not self.ended.done():
            self.ended.set_result(None)


class Subscriber:
    """Subscribes to `channel` at `url` and keeps it subscribed (reconnecting with backoff)."""

    def __init__(self, url: str, channel: str, deliver: Callable[[bytes], None],
                 lost: Callable[[BaseException], None], *, connect_timeout_s: float | None,
                 read_timeout_s: float | None) -> None:
        self.url = url
        self.channel = channel
        self.deliver = deliver
        self.lost = lost
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.live = False  # subscribed now: a message published now reaches `deliver`
        self.refused: Exception | None = None  # refused for good (an ACL rule, the URL)
        self.messages = 0  # messages delivered
        self.failures = 0  # subscriptions that failed in a row (0: live, or not tried yet)
        self.tried = asyncio.Event()  # the first subscription was made, or failed
        self._proto: PushProtocol | None = None

    async def run(self) -> None:
        """Subscribe, and again after each loss, until cancelled or refused for good."""
        backoff = Backoff()
        while True:
            try:
                proto = await self._subscribe()
            except Exception as exc:
                self.tried.set()
                # Refused for good (NOPERM, a state URL this client cannot use): it never
                # listens. Away, BUSY, max clients: later.
                if not isinstance(exc, ConnectionLost) and transient_reason(exc) is None:
                    self.refused = exc
                    log.warning("replies cannot be subscribed to at %s: %s; every call is "
                                "answered on the bus", shown_url(self.url), exc, extra={
                                    "event": "client.subscribe_refused"})
                    return
                self._failed(exc)
                await asyncio.sleep(backoff.next())
                continue
            self.tried.set()
            if self.failures:
                log.info("replies subscribed to again at %s after %d failed tries",
                         shown_url(self.url), self.failures,
                         extra={"event": "client.subscribed"})
                self.failures = 0
            began = proto.loop.time()
            try:
                await self._keep(proto)
            finally:
                self.live = False
                self._close()
            self.lost(proto.closed or ConnectionLost("the subscription ended"))
            if proto.loop.time() - began > KEPT_S:  # (one that keeps breaking: backed off)
                backoff.reset()
            await asyncio.sleep(backoff.next())

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if self.failures == 1:  # (one line an outage, not one a retry)
            log.warning("replies cannot be subscribed to at %s: %s; calls are answered on "
                        "the bus meanwhile, and the subscription is tried again with backoff",
                        shown_url(self.url), exc, extra={"event": "client.subscribe_failed"})

    async def _keep(self, proto: PushProtocol) -> None:
        """Until the connection ends: a PING every PING_S, so a path gone silent (a dropped
        connection the kernel has not noticed) fails the read timeout, not the replies."""
        while not proto.ended.done():
            await asyncio.wait([proto.ended], timeout=PING_S)
            if proto.ended.done() or proto.closed is not None:
                return
            _command(proto, "PING").add_done_callback(_retrieved)

    async def _subscribe(self) -> PushProtocol:
        def factory(url: str, read_timeout_s: float | None) -> PushProtocol:
            return PushProtocol(url, read_timeout_s, self._message)

        proto = await open_socket(self.url, self.connect_timeout_s, self.read_timeout_s, factory)
        assert isinstance(proto, PushProtocol)
        self._proto = proto
        try:
            await _command(proto, "SUBSCRIBE", self.channel)
        except BaseException:
            self._close()
            raise
        self.live = True
        return proto

    def _message(self, data: bytes) -> None:
        self.messages += 1
        self.deliver(data)

    def _close(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()

    def close(self) -> None:
        self.live = False
        self._close()


def _command(proto: PushProtocol, *args: Arg) -> asyncio.Future[Any]:
    """One command written at once; the future of its reply (a push is not one)."""
    future: asyncio.Future[Any] = proto.loop.create_future()
    if not proto.waiting:
        proto.start_waiting()
    proto.waiting.append(future)
    encode_command(args, proto.out)
    proto.flush()
    return future


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A PING's reply is not awaited: its failure (the connection's) is taken here."""
    if not future.cancelled():
        future.exception()
