"""`Resends`: how a `StateClient` (bus/client.py) sends one call until its reply comes, and the
one horizon its re-sends keep.

A call carries its deadline (`deadline_ms`, epoch ms: now + its timeout, unless given), so a
call the client gave up on is never applied later. It is re-sent with the same id and
deadline at even intervals of its timeout (`retries`), and after a transient Redis error (a
refused or broken connection, LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN) after a
backoff (50 ms doubling to 1 s, jittered); past the timeout it raises UNAVAILABLE when it
never reached the stream, TIMEOUT when it may have.

The horizon: the service keeps a call's record (its reply, by id) for its dedupe window
after the call ran, and a re-send read after the record is gone would apply the call again.
So no re-send goes out later than half the SERVICE's window after the first send that may
have reached the stream. The service tells its window where its counters are
(`<prefix>:stats:<service>`, field `dedupe_window_ms`: bus/stats.py; written at its start and
with its counters); the client reads it at connect and again every WINDOW_REFRESH_S, never
per call. Where it cannot be read (a service not started yet, or of a version that does not
tell it; `acl` mode, whose principals may read nothing but their replies) the client keeps
the smaller of its own `dedupe_window_ms` and the default window, `settings.DEDUPE_WINDOW_MS`:
a client set to a longer window than its service re-sends within the service's.

A mixin of `StateClient`, which holds the state it uses (declared below for the type
checker).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from stateworker.bus.ids import CallIds
from stateworker.bus.protocol import Shards, call_entry
from stateworker.bus.reply_reader import Waiter, not_sent_text, timeout_text
from stateworker.bus.routes import Routes
from stateworker.bus.stats import WINDOW_FIELD
from stateworker.clock import now_ms, rfc3339_ms
from stateworker.errors import CallTimeout, InvalidRequest, Unavailable, error_from, shown
from stateworker.settings import DEDUPE_WINDOW_MS, Settings
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.plans import redis_error
from stateworker.transport.retry import Backoff, transient_reason
from stateworker.transport.subscriber import Subscriber
from stateworker.transport.wire import ConnectionLost, ReplyError

MAX_TIMEOUT_S = 366 * 86_400  # a call's timeout, at most (its deadline is epoch ms from it)
WINDOW_REFRESH_S = 60.0  # how often the service's dedupe window is read again


def fallback_window_ms(settings: Settings) -> int:
    """The window the re-sends keep to while the service's is unknown: the smaller of the
    client's own and the default (a service's window is the default unless set)."""
    return min(settings.dedupe_window_ms, DEDUPE_WINDOW_MS)


class Resends:
    """A `StateClient`'s sending of one call: deadline, re-sends, backoff, the horizon."""

    settings: Settings
    url: str
    conn: RedisConnection
    timeout: float
    retries: int
    caller: str | None
    shards: Shards
    reply_key: str
    principal: str | None
    resend_window_ms: int  # the dedupe window the re-sends keep to (the service's, once read)
    service_window_ms: int | None  # the service's, as it told it (None: not read)
    _stats_key: str
    _one_stream: str | None
    _routes: Routes | None
    _published: Subscriber | None
    _pending: dict[str, Waiter]
    _ids: CallIds
    _closed: bool

    if TYPE_CHECKING:  # (StateClient's: a transient Redis state met, counted)
        def _met(self, error: BaseException | None) -> None: ...

    async def _learn_window(self) -> None:
        """Read the service's dedupe window (HGET of its stats hash); what cannot be read
        leaves the window in use as it is. Not in `acl` mode: a principal may not read it."""
        if self.principal is not None:
            return
        try:
            told = await self.conn.execute("HGET", self._stats_key, WINDOW_FIELD)
            window_ms = None if told is None else int(told)
        except (ConnectionLost, ReplyError, ValueError):
            return
        if window_ms is not None and window_ms > 0:
            self.service_window_ms = self.resend_window_ms = window_ms

    async def _follow_window(self) -> None:
        """The service's window read again every WINDOW_REFRESH_S (a restart may change it)."""
        if self.principal is not None:
            return
        while True:
            await anyio.sleep(WINDOW_REFRESH_S)
            await self._learn_window()

    async def _connect(self, end: float) -> BaseException | None:
        """Connect the sending connection within the call's time; the failure, or None."""
        try:
            with anyio.fail_after(max(end - time.monotonic(), 0.0)):
                await self.conn.connect()
        except ConnectionLost as exc:
            return exc
        except TimeoutError:
            return ConnectionLost(f"cannot connect to Redis at {shown_url(self.url)} within the "
                                  "call's time")
        return None

    async def _call(self, fn: str, body: bytes | str, timeout: float | None, call_id: str,
                    context: Mapping[str, Any] | None, deadline_ms: int | None,
                    partition: int | None) -> bytes:
        wait_s = timeout or self.timeout
        if not 0 < wait_s <= MAX_TIMEOUT_S:  # (not NaN, not past what a deadline can hold)
            raise InvalidRequest(f"timeout: must be a positive number of seconds, at most "
                                 f"{MAX_TIMEOUT_S} s (a year), got {wait_s!r}",
                                 {"path": "timeout", "limit": MAX_TIMEOUT_S})
        start = time.monotonic()
        end = start + wait_s
        if deadline_ms is None:
            deadline_ms = now_ms() + math.ceil(wait_s * 1000)
        reply_list = self.reply_key
        if self._routes is not None:  # (a cluster: the list, the shard on the state's node)
            stream, reply_list = self._routes.pick(partition, call_id)
        else:
            stream = self._one_stream or self.shards.stream_at(partition, call_id)
        published = self._published
        fields = call_entry(stream, call_id, fn, body, reply_list, deadline_ms, self.caller,
                            context, published is not None and published.live)
        if call_id in self._pending:  # (its reply would go to one of them alone)
            raise InvalidRequest(
                f"call_id: {shown(call_id)} is already in flight in this client (one call "
                "per id at a time: the client re-sends it itself; await the first call)",
                {"path": "call_id", "call_id": call_id})
        waiter = self._pending[call_id] = Waiter()
        sends = 0
        maybe_sent = False  # an XADD went out that may have reached the stream
        # Re-sent only within half the service's dedupe window after the first send that may
        # have reached the stream: the call's record is kept a window after it ran, and a
        # re-send read after the record is gone would apply the call again.
        resend_until = math.inf
        resend_s = self.resend_window_ms / 2000
        last_failure: BaseException | None = None  # the last transient error met
        backoff: Backoff | None = None
        full: ReplyError | None = None  # a re-send refused: Redis out of memory
        try:
            while waiter.reply is None:
                failure: BaseException | None = None
                if time.monotonic() >= resend_until:  # (past it: the reply, or the timeout)
                    await waiter.pause(end - time.monotonic())
                    break
                # Sent without waiting for Redis to say so: one wake-up per call, not two.
                xadd = self.conn.send_pipeline([fields])
                if xadd is None:  # not connected (yet, or since Redis went away)
                    failure = await self._connect(end)
                else:
                    sends += 1
                    sent_at = time.monotonic()
                    if fields[-2] == "publish":  # (a re-send's reply comes on the list: a
                        fields = fields[:-2]  # subscription lost its first, or is dead)
                    xadd.add_done_callback(waiter.sent)
                    # The re-sends are spread evenly over the call's time.
                    waiter.deadline = min(end, start + sends * wait_s / (self.retries + 1))
                    await waiter.future
                    if waiter.reply is not None:
                        break
                    failure, waiter.error = waiter.error, None
                    waiter.future = asyncio.get_running_loop().create_future()
                    if not isinstance(failure, ReplyError):  # no error reply: it may have run
                        maybe_sent = True
                        resend_until = min(resend_until, sent_at + resend_s)
                    elif str(failure).startswith("OOM"):  # Redis at maxmemory
                        if not maybe_sent:  # (true: no send of it reached the stream)
                            raise redis_error(failure, f"{fn}: sending the call") from failure
                        # An earlier send reached the stream and may be applied: its reply
                        # may come yet (once Redis has room), so re-sent as after a
                        # transient error; past the timeout, TIMEOUT says it may be applied.
                        full = failure
                    elif transient_reason(failure) is None:  # refused for good
                        raise Unavailable(f"{fn}: the call could not be sent: {failure}",
                                          {"call_id": call_id}) from failure
                if self._closed or time.monotonic() >= end:
                    break
                if failure is None:
                    continue  # connected, or time to re-send
                # A transient error: back off (a reply to an earlier send may still come
                # meanwhile), then re-send with the same id and deadline.
                last_failure = failure
                self._met(failure)
                backoff = backoff or Backoff()
                await waiter.pause(min(backoff.next(), end - time.monotonic()))
                if self._closed:
                    break
        finally:
            if self._pending.get(call_id) is waiter:
                del self._pending[call_id]
        reply = waiter.reply
        if reply is None:
            if self._closed:
                raise Unavailable(f"{fn}: the client was closed before the reply came (call id "
                                  f"{call_id}; sent with deadline_ms {deadline_ms})",
                                  {"call_id": call_id, "deadline_ms": deadline_ms})
            if maybe_sent:
                raise CallTimeout(*timeout_text(fn, call_id, wait_s, sends, deadline_ms,
                                                rfc3339_ms(deadline_ms) or "", full))
            raise Unavailable(*not_sent_text(fn, call_id, self.url, wait_s,
                                             last_failure or "no time left to send it"))
        if not reply.ok:
            error = reply.error
            raise error_from(str(error.get("code", "INTERNAL")), str(error.get("message", "")),
                             error.get("details") or {})
        return bytes(reply.result)
