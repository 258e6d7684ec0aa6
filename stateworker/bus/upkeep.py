"""`Upkeep`: what a `BusRuntime` (bus/runtime.py) does around serving its calls, none of it on
the way of one call: the start (the consumer groups made, the service's dedupe window told in
its stats hash, waiting for a Redis that is away or loading), the drain at stop (calls in
flight and read ahead finished within `grace_s`), the fetcher (a flooding caller's parked
entries read back, XRANGE, as its lane runs low: bus/lanes.py) and the reclaim (XAUTOCLAIM of
entries idle longer than the visibility timeout, served as any read) with, at most once a
minute, the sweep (consumers with nothing pending idle past `BusOptions.dead_after_ms` removed
from each stream's group, in one script where the streams are: sweep.lua, decision 0068;
without it every restart would leave a consumer in the group for good).

A mixin of `BusRuntime`, which holds the state it uses (declared below for the type checker)
and serves what these loops hand it (`_spawn`, `_serve_lanes`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup

from stateworker.bus.lanes import Entry, Lanes
from stateworker.bus.protocol import Bus, BusOptions
from stateworker.bus.reply_writer import ReplyWriter
from stateworker.bus.sources import Sources, claimed_entries, create_groups, swept_consumers
from stateworker.bus.stats import CONSUMERS_REMOVED
from stateworker.errors import StateError, Unavailable
from stateworker.logs import repeats
from stateworker.scripts.library import Library
from stateworker.scripts.replies import Swept
from stateworker.transport.connection import RedisConnection
from stateworker.transport.retry import Backoff, no_redis_text, transient_reason
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.bus")

SKIM_WAIT_S = 0.05  # reading ahead, caught up: how long before looking again at most
# The sweep of dead consumers: once a reclaim round this long after the last, at most (and
# every half `dead_after_ms` when that is shorter): a consumer goes within 1.5 times it.
SWEEP_EVERY_S = 60.0
# How Redis words an ACL refusal: of a command (and, on 7.2+, of a script's); of a script's
# command on Redis 7.0 ("ERR The user executing the script can't run this command ...").
ACL_REFUSED = ("NOPERM", "can't run this command or subcommand")


class Upkeep:
    """The start, the drain, the fetcher and the reclaim of a `BusRuntime`."""

    conn: RedisConnection
    bus: Bus
    options: BusOptions
    sources: Sources
    consumer: str
    replies: ReplyWriter
    scripts: Library  # the bus's scripts where its streams are (upkeep_bindings.bus_library)
    sweeping: bool  # False once Redis refused this runtime's user the sweep (its ACL)
    lanes: Lanes
    start_wait_s: float | None
    transient: Counter[str]
    _stopping: anyio.Event
    _idle: anyio.Event
    _to_fetch: anyio.Event
    _in_flight: int
    _closed: bool

    if TYPE_CHECKING:  # (BusRuntime's: how what these loops find is served)
        def _spawn(self, calls: TaskGroup, entries: list[Entry]) -> None: ...

        def _serve_lanes(self) -> None: ...

    async def _start(self) -> bool:
        """Create the consumer group, waiting (with backoff, at most `start_wait_s`) while
        Redis refuses connections or is in a transient state. One log line says so. False:
        `stop()` came first."""
        end = None if self.start_wait_s is None else time.monotonic() + self.start_wait_s
        backoff = Backoff()
        while not self._stopping.is_set():
            try:
                await create_groups(self.conn, self.sources, self.bus.group)
                # (its dedupe window told before the first call: bus/stats.py, bus/resends.py)
                if told := self.replies.stats.tell_commands(self.bus.stats_key):
                    await self.conn.pipeline(told)
                break
            except (ConnectionLost, ReplyError) as exc:
                reason = transient_reason(exc)
                if reason is None:
                    raise
                self.transient[reason] += 1
                text = (no_redis_text(self.conn.url, exc) if reason == "CONNECTION" else
                        f"Redis at {self.conn.shown} is not serving yet ({exc})")
                delay = backoff.next()
                if end is not None and time.monotonic() + delay >= end:
                    raise Unavailable(f"{text}; gave up after {self.start_wait_s:g} s",
                                      {"redis": self.conn.shown}) from None
                if backoff.failures == 1:
                    log.warning("%s; waiting for it%s", text, "" if end is None else
                                f" (at most {self.start_wait_s:g} s)",
                                extra={"event": "bus.waiting", "service": self.bus.service,
                                       "redis": self.conn.shown})
                await self._pause(delay)
        if backoff.failures and not self._stopping.is_set():
            log.info("Redis at %s serves", self.conn.shown, extra={"event": "bus.redis_back"})
        return not self._stopping.is_set()

    def _shards(self) -> dict[str, int]:
        """`{"shards": N}` for a sharded service (STATEWORKER_BUS_SHARDS), else nothing."""
        count = len(self.bus.streams)
        return {"shards": count} if count > 1 else {}

    async def _pause(self, seconds: float) -> None:
        """Sleep, but no longer than until `stop()`."""
        with anyio.move_on_after(seconds):
            await self._stopping.wait()

    async def _drain(self, calls: TaskGroup) -> None:
        """Wait for calls in flight and those read ahead (the lanes: read, so this
        consumer's to answer), at most `grace_s`; then cancel what is left (pending: a
        restart or another replica serves it)."""
        with anyio.move_on_after(self.options.grace_s):
            while self._in_flight or self.lanes.held or self.lanes.parked:
                if self._in_flight:
                    await self._idle.wait()
                else:  # (parked ones only: fetched, then started by the fetcher)
                    self._to_fetch.set()
                    await anyio.sleep(SKIM_WAIT_S)
        self._closed = True
        if self._in_flight:
            log.warning("grace period over, cancelling calls", extra={
                "event": "bus.cancel", "service": self.bus.service, "in_flight": self._in_flight})
        calls.cancel_scope.cancel()

    def _history_again(self) -> None:
        """Read every stream's pending history again: what the lanes held comes back with
        it (so they start empty; what is being served is left out when it comes)."""
        self.sources.all_history()
        self.lanes = Lanes()

    async def _fetch_loop(self) -> None:
        """Parked entries back into their lanes (XRANGE each), as the lanes run low."""
        while not self._closed:
            await self._to_fetch.wait()
            self._to_fetch = anyio.Event()
            lanes, wanted = self.lanes, self.lanes.to_fetch()
            if not wanted:
                continue
            try:
                replies = await self.conn.pipeline(
                    [["XRANGE", stream, entry_id, entry_id]
                     for _, refs in wanted for stream, entry_id in refs])
            except (ConnectionLost, ReplyError) as exc:
                log.warning("reading parked calls failed: %s", exc,
                            extra={"event": "bus.fetch_failed", "service": self.bus.service})
                self._history_again()  # (they are pending: read again from the history)
                continue
            if lanes is not self.lanes:  # (the history is read again meanwhile)
                continue
            at = 0
            for key, refs in wanted:
                found = replies[at:at + len(refs)]
                at += len(refs)
                lanes.fetched(key, [(ref, reply[0][1] if reply else None)
                                    for ref, reply in zip(refs, found, strict=True)])
            self._serve_lanes()

    async def _reclaim_loop(self, calls: TaskGroup) -> None:
        period = self.options.visibility_timeout_ms / 2000
        sweep_every = min(SWEEP_EVERY_S, self.options.dead_after_ms / 2000)
        swept = time.monotonic()
        while not self._stopping.is_set():
            with anyio.move_on_after(period):
                await self._stopping.wait()
            if self._stopping.is_set():
                return
            try:
                await self._reclaim(calls)
            except (ConnectionLost, ReplyError) as exc:
                log.warning("reclaim failed: %s", exc, extra={"event": "bus.reclaim_failed"})
            # (after the reclaim: a dead consumer whose last entries it took has nothing
            # pending now, and goes in this very round)
            if self.sweeping and time.monotonic() - swept >= sweep_every:
                swept = time.monotonic()
                await self._sweep()

    async def _sweep(self) -> None:
        """Remove the dead consumers of every stream's group (sweep.lua): counted in the
        stats hash (`consumers_removed`) and said in one line. A refusal by the user's ACL is
        said once and the sweep is not tried again (a user worker's Redis user may lack it:
        docs/security.md); other failures are tried again next time."""
        extra = {"event": "bus.consumers_removed", "service": self.bus.service}
        try:
            swept = await swept_consumers(self.conn, self.scripts, self.sources, self.bus.group,
                                          self.consumer, self.options.dead_after_ms)
        except (StateError, ConnectionLost, ReplyError) as exc:
            repeats.log(log, logging.WARNING, "removing dead consumers failed: %s", exc,
                        extra={**extra, "event": "bus.sweep_failed"})
            return
        removed = sum(result.removed for result in swept if isinstance(result, Swept))
        if removed:
            self.replies.stats.pending[CONSUMERS_REMOVED] += removed
            log.info("removed %d dead consumers (nothing pending, idle over %d ms)", removed,
                     self.options.dead_after_ms, extra={**extra, "count": removed})
        refused = next((result for result in swept if isinstance(result, ReplyError)), None)
        if refused is None:
            return
        if any(words in str(refused) for words in ACL_REFUSED):
            self.sweeping = False
            log.warning("removing dead consumers is refused to this Redis user, not tried again "
                        "(it needs +fcall, +xinfo|consumers, +xgroup|delconsumer; docs/"
                        "security.md): %s", refused, extra={**extra, "event": "bus.sweep_refused"})
        else:
            repeats.log(log, logging.WARNING, "removing dead consumers failed: %s", refused,
                        extra={**extra, "event": "bus.sweep_failed"})

    async def _reclaim(self, calls: TaskGroup) -> None:
        room = lambda: self.options.concurrency - self._in_flight  # noqa: E731
        async for source, entries, deleted in claimed_entries(
                self.conn, self.sources, self.bus.group, self.consumer,
                self.options.visibility_timeout_ms, room):
            if entries:
                log.info("reclaimed entries of a dead consumer", extra={
                    "event": "bus.reclaim", "service": self.bus.service, "count": len(entries),
                    "stream": source.stream})
                self._spawn(calls, [Entry((source.stream, entry_id), flat, source)
                                    for entry_id, flat in entries])
            for entry_id in deleted:  # deleted from the stream meanwhile
                self.replies.queue(b"", None, (source.stream, entry_id), None)
