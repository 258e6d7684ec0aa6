"""`BusRuntime`: the loops that serve one service's streams (bus/protocol.py: the protocol;
bus/sources.py: which streams, and whose: `acl` mode's principals). This module holds the
reader: what it reads, how much, and which calls start when; how a call it hands on is served
(a batch of plans, a handler call) is bus/serving.py's (`Serving`), and the start, the drain,
the fetcher and the reclaim are bus/upkeep.py's (`Upkeep`): both mixins of `BusRuntime`.

    reader   XREADGROUP batches -> the callers' lanes (bus/lanes.py: a fair share each) ->
             one task per batch (plans) or per call (user handlers), bounded by
             `concurrency` calls in flight; while a backlog waits it reads ahead, so
             one caller's flood never stands ahead of another caller's next call
    fetcher  parked entries of a flooding caller read back (XRANGE) as its lane runs low
    call     deadline check -> plan or handler -> queue (reply key, reply, entry id)
    flusher  queued replies -> LPUSH per reply list, PEXPIRE, XACK, XDEL in one pipeline
             (the queue, the flusher and the call records: bus/reply_writer.py)
    reclaim  XAUTOCLAIM entries idle longer than the visibility timeout -> call tasks; then,
             at most once a minute, the dead consumers removed (sweep.lua)

Redis going away or not serving for a while (a refused or broken connection, LOADING after a
restart, BUSY ...) never ends these loops: each backs off (50 ms doubling to 1 s, jittered)
and goes on. Calls it could not answer stay pending and unacknowledged; once Redis serves
again, the reader reads this consumer's pending history again and answers them (from their
records when they ran), and the reclaim takes over what any consumer left.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from stateworker.bus.lanes import Entry, Lanes
from stateworker.bus.protocol import BatchHandler, Bus, BusOptions, Handler, Ref, default_consumer
from stateworker.bus.reply_writer import ReplyWriter
from stateworker.bus.serving import Serving
from stateworker.bus.sources import Source, Sources, follow_principals, recover_groups
from stateworker.bus.stats import Stats
from stateworker.bus.upkeep import SKIM_WAIT_S, Upkeep
from stateworker.scripts.upkeep_bindings import bus_library
from stateworker.transport.connect import connection_like
from stateworker.transport.connection import RedisConnection
from stateworker.transport.retry import Backoff, transient_reason
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.bus")

SKIM = 512  # entries a read takes ahead (into the lanes) while a backlog waits
WINDOW = 64  # a batch handler's calls in flight taken from the lanes, at most


class BusRuntime(Serving, Upkeep):
    """Serves one service's stream with `handler` until `stop()`."""

    def __init__(self, conn: RedisConnection, bus: Bus, options: BusOptions, *,
                 handler: Handler | None = None, batch: BatchHandler | None = None,
                 record_ttl_ms: int | None = None, start_wait_s: float | None = 60.0,
                 describe: dict[str, Any] | None = None, sources: Sources | None = None,
                 functions: Iterable[str] = (), dedupe_window_ms: int | None = None) -> None:
        """`handler` runs each call in a task of its own (user workers); `batch` turns calls
        into plans and runs a whole batch together (the state service). `start_wait_s`: how
        long `run` waits for a Redis that refuses connections or is loading (None: as long
        as it takes). `describe`: more fields for the one "serving" log line. `sources`: the
        streams read (default: the service's stream alone; bus/sources.py). `functions`: the
        names served, the function labels of `stats` (bus/stats.py). `dedupe_window_ms`: how long
        a call's record is kept (default `record_ttl_ms`), told to clients in the stats hash:
        they re-send a call within half of it only (bus/resends.py)."""
        assert (handler is None) != (batch is None), "give one of handler and batch"
        self.conn = conn  # shared, pipelined: scripts, replies, acks
        # Blocking reads only (one per slot on a cluster: transport/streamread.py).
        self.reader = StreamReader(connection_like(conn))
        self.bus = bus
        self.handler = handler
        self.batch = batch
        self.options = options
        self.sources = sources or Sources(bus.prefix, bus.service, bus.streams)
        self.consumer = options.consumer or default_consumer()
        self.stats = Stats(functions, record_ttl_ms if dedupe_window_ms is None
                           else dedupe_window_ms)
        # record_ttl_ms set: replies are recorded (user workers)
        self.replies = ReplyWriter(conn, bus, options, self.stats, record_ttl_ms)
        self.scripts = bus_library(conn)  # (the sweep of dead consumers: bus/upkeep.py)
        self.sweeping = True
        self._stopping = anyio.Event()
        self._in_flight = 0
        self._running: set[Ref] = set()  # entries being served: never served twice at once
        # A user worker's calls being run, by record key (one per call id): the call's
        # digest. An entry of an id already running here (the client's re-send) is not run.
        self._running_ids: dict[str, bytes] = {}
        self._idle = anyio.Event()  # set when no call is in flight
        self._freed = anyio.Event()  # set when a call finishes
        self.lanes = Lanes()  # entries read, not yet served: one lane per caller
        self._calls: TaskGroup | None = None  # (the task group calls run in)
        self._to_fetch = anyio.Event()  # set when a lane's parked entries are wanted
        self._closed = False  # the grace period is over: nothing more starts
        self._ahead = False  # the last read was full: the next one reads ahead
        # Calls in flight taken from the lanes, at most: a batch handler's calls queue on
        # one connection, so a call taken later waits for all of them (and 64 keep Redis
        # as busy as 1,024); a handler's calls run side by side.
        self._window = min(options.concurrency, WINDOW) if batch is not None \
            else options.concurrency
        self.start_wait_s = start_wait_s
        self.describe = describe or {}
        self.transient: Counter[str] = Counter()  # transient Redis states met, by kind

    # ---- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`.

        Raises:
            Unavailable (UNAVAILABLE): Redis refused connections or stayed in a transient
                state (LOADING ...) for `start_wait_s` at start; the message names the URL
                and how to start the service.
            ReplyError: Redis refused to create the consumer group (e.g. the stream key
                holds another type).
        """
        if not await self._start():  # stopped while waiting for Redis
            task_status.started()
            return
        # One line: what serves where (the JSON log line carries the fields; "serving" is
        # what scripts wait for).
        log.info("serving", extra={"event": "bus.start", "service": self.bus.service,
                                   "stream": self.bus.stream, "consumer": self.consumer,
                                   **self._shards(),
                                   **self.describe})
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.replies.flusher)
                async with anyio.create_task_group() as calls:
                    self._calls = calls
                    calls.start_soon(self._reclaim_loop, calls)
                    calls.start_soon(self._fetch_loop)
                    task_status.started()
                    await self._read_loop(calls)
                    await self._drain(calls)
                await self.replies.flush_all()
                await self.replies.write_stats(force=True)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.reader.close()
            log.info("stopped", extra={"event": "bus.stop", "service": self.bus.service})

    def stop(self) -> None:
        """Stop reading; calls already read finish (within the grace period) and are answered."""
        self._stopping.set()
        self._freed.set()  # a reader waiting for a free call slot sees the stop at once

    # ---- reading -----------------------------------------------------------------------------
    async def _read_loop(self, calls: TaskGroup) -> None:
        # First this consumer's own pending entries of each stream (a restart under the same
        # name), then new ones (bus/sources.py keeps the positions).
        sources = self.sources
        backoff = Backoff()  # failed reads in a row
        again = Backoff()  # re-reads of the pending history for calls left unanswered
        while not self._stopping.is_set():
            room = min(self.options.read_count, self.options.concurrency - self._in_flight)
            # Reading ahead (into the callers' lanes, bus/lanes.py) while a backlog waits:
            # the last read was full, read entries wait in the lanes, or every slot is busy.
            ahead = self._ahead or room <= 0 or bool(self.lanes.held or self.lanes.parked)
            if ahead and not self.lanes.accepting:
                await self._freed.wait()  # (as much read ahead as parks: wait for a slot)
                self._freed = anyio.Event()
                continue
            if self.replies.unanswered:
                # Calls met Redis away and stay pending: read them again once it serves (not
                # at once: Redis may be away still; a reclaim takes what this one misses),
                # before anything read after them (a worker serving one call at a time keeps
                # its stream's order: trigger deliveries per scope). The lanes are dropped
                # first, so none of what they held starts during the pause.
                self._history_again()
                await self._pause(again.next())
                self.replies.unanswered = False
            try:
                await follow_principals(self.conn, self.sources, self.bus.group)
                # COUNT is per stream: the calls in flight stay within `concurrency`. A
                # shard's batch (one pipeline) is up to `read_count` long, as one stream's
                # (16 / 3 a shard cost 14% at 64 in flight); `acl` mode's many principal
                # streams share `read_count`, as before. Reading ahead takes SKIM at a time
                # and never blocks: it takes what already waits in the stream, never a new
                # entry that a replica with a free slot, blocked on its read, would get.
                streams = len(sources.positions)
                count = SKIM if ahead else max(1, room // streams if sources.closed_shared
                                               else min(room, (self.options.concurrency
                                                               - self._in_flight) // streams))
                reply = await self.reader.read(
                    ["XREADGROUP", "GROUP", self.bus.group, self.consumer, "COUNT", count,
                     *(() if ahead else ("BLOCK", self.options.block_ms))],
                    *sources.read_args())
            except (ConnectionLost, ReplyError) as exc:
                self.transient[transient_reason(exc) or "OTHER"] += 1
                if not backoff.failures:  # one line per outage, not one per retry
                    log.warning("read failed: %s; retrying with backoff", exc,
                                extra={"event": "bus.read_failed", "service": self.bus.service})
                await self._pause(backoff.next())
                await recover_groups(self.conn, self.sources, self.bus.group)
                self._history_again()  # then the pending calls first: some lost their reply
                continue
            if backoff.failures:
                log.info("reading again after %d failed reads", backoff.failures,
                         extra={"event": "bus.read_recovered", "service": self.bus.service})
                backoff.reset()
            if self.replies.unanswered:
                continue  # (what was read is pending: it comes again, in order, with the history)
            read = {stream.decode(): entries for stream, entries in reply or []}
            if read and again.failures and not self.replies.unanswered:
                again.reset()
            sources.advance(read)
            got = [(source, entries) for stream, entries in read.items()
                   if entries and (source := sources.by_stream.get(stream))]
            self._ahead = any(len(entries) >= count for _, entries in got)  # full: more wait
            if not ahead:  # nothing waits, a slot for each: served at once, as read
                self._spawn(calls, [Entry((source.stream, entry_id), flat, source)
                                    for source, entries in got for entry_id, flat in entries])
                continue
            for source, entries in got:
                self.lanes.add(source, entries, self._running)
            self._serve_lanes()
            if not got and (self.lanes.held or self.lanes.parked or room <= 0):
                # Caught up, still busy: look again when a call finishes (a new caller's
                # call is read within one batch), or after SKIM_WAIT_S.
                self._freed = anyio.Event()
                with anyio.move_on_after(SKIM_WAIT_S):
                    await self._freed.wait()

    def _serve_lanes(self) -> None:
        """Start what the free slots take from the lanes, `read_count` a batch (the streams'
        entries of one turn together: on a cluster the shards' calls then share each node's
        pipeline); a lane running low on entries in memory is fetched."""
        if self._calls is None or self._closed:
            return
        if self.replies.unanswered:  # (the read loop reads the history again first)
            self._freed.set()
            return
        while self.lanes.held and self._in_flight < self._window:
            self._spawn(self._calls, self.lanes.take(
                min(self.options.read_count, self._window - self._in_flight)))
        if self.lanes.parked:
            self._to_fetch.set()

    def _spawn(self, calls: TaskGroup, entries: list[Entry]) -> None:
        """Serve entries read, as one batch of plans."""
        live: list[tuple[Ref, list[bytes], Source]] = []
        for ref, flat, source, _ in entries:
            if flat is None:  # deleted while pending (XAUTOCLAIM reports these as null)
                self.replies.queue(b"", None, ref, None)
            # Not one this consumer is still serving, nor one waiting in its lanes (its own
            # reclaim takes over what it read ahead once that is older than the timeout).
            elif ref not in self._running and ref not in self.lanes.refs:
                live.append((ref, flat, source))
                self._running.add(ref)
        if not live:
            return
        self._in_flight += len(live)
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        if self.batch is not None:
            # Parsed, checked and sent right here: the scripts are on the wire before the
            # next read and before the task that waits for them even starts.
            ready = self._prepare_batch(live)
            sent = self.batch.send([plan for _, plan in ready]) if ready else None
            # (named: anyio otherwise builds the name from the function, per batch)
            calls.start_soon(self._serve_batch, ready, sent, [ref for ref, _, _ in live],
                             name="serve batch")
        else:
            for ref, flat, source in live:
                self._begin(calls, ref, flat, source)

    def _finished(self, refs: list[Ref]) -> None:
        self._running.difference_update(refs)
        self._in_flight -= len(refs)
        self._freed.set()
        if self.lanes.held or self.lanes.parked:  # (read ahead: served as slots free)
            self._serve_lanes()
        if self._in_flight == 0:
            self._idle.set()
