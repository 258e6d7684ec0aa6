"""The reply side of a `StateClient` (bus/client.py): its reply list, popped by one task
(`ReplyReader.read`, BLMPOP) that hands each reply to the call waiting for its id (a `Waiter`
in the client's `pending`), and one sweeper that wakes the calls whose time is up."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import anyio

from stateworker.bus.protocol import Reply, parse_reply, unreadable_reply
from stateworker.errors import shown
from stateworker.settings import Settings
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.retry import Backoff
from stateworker.transport.wire import ConnectionLost, ReplyError

SWEEP_INTERVAL_S = 0.05  # resolution of call timeouts


def timeout_text(fn: str, call_id: str, timeout_s: float, sends: int, deadline_ms: int,
                 when: str, full: object = None) -> tuple[str, dict[str, Any]]:
    """Message (one short line) and details of a client's TIMEOUT for a call sent with
    `deadline_ms` (`when`: the same time as RFC 3339): until when it may still be applied,
    and in `details` how to learn its outcome. `full`: Redis refused a re-send, out of
    memory (named: the reply may be missing for that)."""
    why = "" if full is None else (
        "; Redis refused the re-sends: it reached its memory limit (maxmemory)")
    return (f"{fn}: no reply within {timeout_s:g} s; applied by {when} "
            f"(deadline_ms {deadline_ms}) or never{why}",
            {"call_id": call_id, "deadline_ms": deadline_ms, "may_be_applied_until": when,
             "sends": sends, **({} if full is None else {"redis_error": str(full)[:200]}),
             "outcome": "the service starts a call only before its deadline (a state::* call "
                        "applies in one step; a worker function started in time may still be "
                        "running); the same call_id with the same deadline_ms returns its "
                        "outcome: its recorded reply, or DEADLINE_EXCEEDED when it never ran"})


def not_sent_text(fn: str, call_id: str, url: str, timeout_s: float,
                  reason: object) -> tuple[str, dict[str, Any]]:
    """Message and details of a client's UNAVAILABLE for a call that never reached the
    stream: it will never be applied."""
    return (f"{fn}: not sent within {timeout_s:g} s: Redis at {shown_url(url)} was unavailable ({reason}); "
            f"the call (id {shown(call_id)}) never reached the bus and will not be applied",
            {"call_id": call_id, "sent": False, "reason": str(reason)[:200]})


class Waiter:
    """One call waiting for its reply. A bare asyncio future (as in transport/connection.py):
    an anyio Event and cancel scope per call cost more than the rest of the client's work for
    it."""

    __slots__ = ("deadline", "error", "future", "reply")

    def __init__(self) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reply: Reply | None = None
        self.error: BaseException | None = None  # the XADD failed
        self.deadline = math.inf  # time.monotonic(); the sweeper wakes the call after it

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def sent(self, xadd: asyncio.Future[list[Any]]) -> None:
        """Done-callback of the XADD: a failure wakes the call with it."""
        if xadd.cancelled():
            self.error = ConnectionLost("the send was cancelled")
        elif xadd.exception() is not None:
            self.error = xadd.exception()
        elif isinstance(xadd.result()[0], Exception):  # a Redis error reply to the XADD
            self.error = xadd.result()[0]
        else:
            return
        self.wake()

    async def pause(self, delay: float) -> None:
        """Wait `delay` seconds, or less when the call is woken (its reply came, the client
        closed); a stale send error that woke it is dropped."""
        self.deadline = math.inf  # not the sweeper's to end
        if delay > 0:
            await asyncio.wait([self.future], timeout=delay)
        if self.future.done():
            self.future = asyncio.get_running_loop().create_future()
            self.error = None


class ReplyReader:
    """Pops the client's reply list on a connection of its own (blocking pops only) and wakes
    the waiting calls. `pending` is the client's: it adds and removes its calls there."""

    def __init__(self, url: str, settings: Settings, reply_key: str,
                 pending: dict[str, Waiter], met: Callable[[BaseException | None], None],
                 conn: RedisConnection | None = None) -> None:
        self.conn = conn or connection_for(url, connect_timeout_s=settings.connect_timeout_s,
                                           read_timeout_s=settings.read_timeout_s)
        self.reply_key = reply_key
        self.pending = pending
        self._met = met  # counts a transient Redis state met (the client's `transient`)

    def wake_all(self) -> None:
        for waiter in list(self.pending.values()):
            waiter.wake()

    async def read(self) -> None:
        """Hand each reply to its call. A failed read (Redis restarting, loading, away) backs
        off and reads again: this task never ends before the client closes."""
        backoff = Backoff()
        while True:
            try:
                # BLMPOP takes every reply waiting (a service writes a batch's replies in one
                # LPUSH), so the calls they wake send their next requests together.
                popped = await self.conn.execute("BLMPOP", 1, 1, self.reply_key, "LEFT",
                                                 "COUNT", 1000)
            except (ConnectionLost, ReplyError) as exc:
                self._met(exc)
                if isinstance(exc, ConnectionLost) and not backoff.failures:
                    # Replies popped on the broken connection, or pushed to a Redis that lost
                    # them in a restart, never arrive: every waiting call re-sends (same id,
                    # same deadline) and gets its reply again from the call's record.
                    self.wake_all()
                await anyio.sleep(backoff.next())
                continue
            if backoff.failures:
                backoff.reset()
            for document in popped[1] if popped else []:
                self.deliver(document)

    async def sweep_timeouts(self) -> None:
        """Wake the calls whose time is up. One sweeper instead of a cancel scope per call:
        a call's own timeout would cost more than the call's Redis work."""
        while True:
            await anyio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for waiter in list(self.pending.values()):
                if waiter.deadline <= now:
                    waiter.wake()

    def deliver(self, document: bytes) -> None:
        """Wake the call a reply document answers (one read here, or published: client.py)."""
        reply = parse_reply(document) or unreadable_reply(document)  # (malformed: INTERNAL)
        if reply is None:  # (no id to be read: not a reply to a call of this client)
            return
        waiter = self.pending.get(reply.id or "")
        if waiter is not None and waiter.reply is None:
            waiter.reply = reply
            waiter.wake()
