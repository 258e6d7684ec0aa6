"""`BusRuntime`: the loops that serve one service's stream (see bus.py for the protocol).

    reader   XREADGROUP batches -> one task per batch (plans) or per call (user handlers),
             bounded by `concurrency` calls in flight
    call     deadline check -> plan or handler -> queue (reply key, reply, entry id)
    flusher  queued replies -> LPUSH per reply list, PEXPIRE, XACK, XDEL in one pipeline
    reclaim  XAUTOCLAIM entries idle longer than the visibility timeout -> call tasks
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus

from stateworker.bus.protocol import (
    Bus,
    BusOptions,
    Call,
    Handler,
    default_consumer,
    parse_entry,
    reply_document,
)
from stateworker.bus.stats import FLUSH_EVERY_S, Stats
from stateworker.clock import now_ms
from stateworker.errors import (
    InternalError,
    InvalidRequest,
    StateError,
    Unavailable,
    deadline_exceeded,
)
from stateworker.transport.connection import Arg, ConnectionLost, RedisConnection, ReplyError
from stateworker.transport.plans import Plan, Sent

log = logging.getLogger("stateworker.bus")

# (reply key, reply document or None, entry id, record key or None)
Outgoing = tuple[bytes, bytes | None, bytes, str | None]


class BatchHandler(Protocol):
    """Calls as plans: `prepare` validates (raising StateError) and gives the call's Plan,
    whose result is the reply's JSON; `execute_many` runs plans together."""

    def prepare(self, call: Call) -> Plan: ...

    def send(self, plans: Sequence[Plan]) -> Sent:
        """Put the plans' first step on the wire now; the token goes to execute_many."""

    async def execute_many(self, plans: Sequence[Plan], sent: Sent,
                           done: Callable[[int, Any], None],
                           after_step: Callable[[], Awaitable[None]]) -> list[Any]: ...


class BusRuntime:
    """Serves one service's stream with `handler` until `stop()`."""

    def __init__(self, conn: RedisConnection, bus: Bus, options: BusOptions, *,
                 handler: Handler | None = None, batch: BatchHandler | None = None,
                 record_ttl_ms: int | None = None) -> None:
        """`handler` runs each call in a task of its own (user workers); `batch` turns calls
        into plans and runs a whole batch together (the state service)."""
        assert (handler is None) != (batch is None), "give one of handler and batch"
        self.conn = conn  # shared, pipelined: scripts, replies, acks
        self.reader_conn = RedisConnection(conn.url, connect_timeout_s=conn.connect_timeout_s,
                                           read_timeout_s=conn.read_timeout_s)  # blocking reads only
        self.bus = bus
        self.handler = handler
        self.batch = batch
        self.options = options
        self.consumer = options.consumer or default_consumer()
        self.record_ttl_ms = record_ttl_ms  # set: replies are recorded here (user workers)
        self.stats = Stats()
        self._outgoing: list[Outgoing] = []
        self._outgoing_ready = anyio.Event()
        self._flush_lock = anyio.Lock()
        self._stopping = anyio.Event()
        self._in_flight = 0
        self._running: set[bytes] = set()  # entry ids being served: never served twice at once
        self._idle = anyio.Event()  # set when no call is in flight
        self._freed = anyio.Event()  # set when a call finishes

    # ---- lifecycle ---------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await self._create_group()
        log.info("serving", extra={"event": "bus.start", "service": self.bus.service,
                                   "consumer": self.consumer, "stream": self.bus.stream})
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._flusher)
                async with anyio.create_task_group() as calls:
                    calls.start_soon(self._reclaim_loop, calls)
                    task_status.started()
                    await self._read_loop(calls)
                    await self._drain(calls)
                await self._flush_all()
                await self._write_stats(force=True)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.reader_conn.close()
            log.info("stopped", extra={"event": "bus.stop", "service": self.bus.service})

    def stop(self) -> None:
        """Stop reading; calls already read finish (within the grace period) and are answered."""
        self._stopping.set()
        self._freed.set()  # a reader waiting for a free call slot sees the stop at once

    async def _create_group(self) -> None:
        try:
            await self.conn.execute("XGROUP", "CREATE", self.bus.stream, self.bus.group, "0",
                                    "MKSTREAM")
        except ReplyError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def _drain(self, calls: TaskGroup) -> None:
        """Wait for calls in flight, at most `grace_s`; then cancel what is left."""
        with anyio.move_on_after(self.options.grace_s):
            while self._in_flight:
                await self._idle.wait()
        if self._in_flight:
            log.warning("grace period over, cancelling calls", extra={
                "event": "bus.cancel", "service": self.bus.service, "in_flight": self._in_flight})
        calls.cancel_scope.cancel()

    # ---- reading -----------------------------------------------------------------------------
    async def _read_loop(self, calls: TaskGroup) -> None:
        start = "0"  # first this consumer's own pending entries (a restart under the same name)
        while not self._stopping.is_set():
            count = min(self.options.read_count, self.options.concurrency - self._in_flight)
            if count <= 0:
                await self._freed.wait()
                self._freed = anyio.Event()
                continue
            try:
                reply = await self.reader_conn.execute(
                    "XREADGROUP", "GROUP", self.bus.group, self.consumer, "COUNT", count,
                    "BLOCK", self.options.block_ms, "STREAMS", self.bus.stream, start)
            except (ConnectionLost, ReplyError) as exc:
                log.warning("read failed: %s", exc, extra={"event": "bus.read_failed"})
                await self._recover()
                continue
            entries = reply[0][1] if reply else []
            if start != ">":  # reading this consumer's own pending history, oldest first
                if not entries:
                    start = ">"
                    continue
                start = entries[-1][0]  # go on after the last one read
            self._spawn(calls, entries)

    async def _recover(self) -> None:
        """Redis away (restart, failover): wait a little, re-create the group if it vanished."""
        await anyio.sleep(0.2)  # back off before reconnecting
        with contextlib.suppress(ConnectionLost, ReplyError):  # the next read reports it
            await self._create_group()

    def _spawn(self, calls: TaskGroup, entries: list[Any]) -> None:
        live = []
        for entry_id, flat in entries:
            if flat is None:  # deleted while pending (XAUTOCLAIM reports these as null)
                self._queue(b"", None, entry_id, None)
            elif entry_id not in self._running:  # not one this consumer is still serving
                live.append((entry_id, flat))
                self._running.add(entry_id)
        if not live:
            return
        self._in_flight += len(live)
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        if self.batch is not None:
            # Parsed, checked and sent right here: the scripts are on the wire before the
            # next read and before the task that waits for them even starts.
            ready = self._prepare_batch(live)
            sent = self.batch.send([plan for _, plan in ready]) if ready else None
            calls.start_soon(self._serve_batch, ready, sent, [entry_id for entry_id, _ in live])
        else:
            for entry_id, flat in live:
                calls.start_soon(self._serve, entry_id, flat)

    def _finished(self, entry_ids: list[bytes]) -> None:
        self._running.difference_update(entry_ids)
        self._in_flight -= len(entry_ids)
        self._freed.set()
        if self._in_flight == 0:
            self._idle.set()

    def _prepare_batch(self, entries: list[tuple[bytes, list[bytes]]]
                       ) -> list[tuple[Call, Plan]]:
        """Calls as plans; a malformed or late call is answered (queued) here."""
        assert self.batch is not None
        ready: list[tuple[Call, Plan]] = []
        for entry_id, flat in entries:
            call, reply_key, call_id, error = self._parse(entry_id, flat)
            if call is None:
                self._answer(reply_key, call_id, None, error, entry_id, None, None)
                continue
            try:
                # The deadline is checked by the plan: a call that was applied before its
                # deadline passed must still get its recorded reply when delivered again.
                ready.append((call, self.batch.prepare(call)))
            except StateError as exc:
                self._answer(call.reply, call.id, None, exc, call.entry_id, None,
                             call.started, call.fn)
            except Exception as exc:  # a bug costs one call, not the batch
                log.exception("preparing a call failed", extra={
                    "event": "call.crashed", "call_id": call.id, "fn": call.fn})
                self._answer(call.reply, call.id, None, InternalError(
                    f"{call.fn} failed inside the service: {type(exc).__name__}"),
                    call.entry_id, None, call.started, call.fn)
        return ready

    async def _serve_batch(self, ready: list[tuple[Call, Plan]], sent: Sent,
                           entry_ids: list[bytes]) -> None:
        """Wait for a batch's plans (every step of all calls in one pipeline); each call is
        answered when its plan is done, and the replies are written after every step."""
        assert self.batch is not None

        def done(index: int, result: Any) -> None:
            call = ready[index][0]
            if isinstance(result, Unavailable):
                # Redis went away mid-call: the script may have run. No reply, no ack: the
                # entry stays pending, and a reclaim answers it from the call's record.
                return
            if isinstance(result, StateError):
                self._answer(call.reply, call.id, None, result, call.entry_id, None,
                             call.started, call.fn)
            else:
                self._answer(call.reply, call.id, result, None, call.entry_id, None,
                             call.started, call.fn)

        try:
            if ready:
                await self.batch.execute_many([plan for _, plan in ready], sent, done,
                                              self._flush_all)
            await self._flush_all()  # at once, rather than a loop iteration later
        finally:
            self._finished(entry_ids)

    async def _reclaim_loop(self, calls: TaskGroup) -> None:
        period = self.options.visibility_timeout_ms / 2000
        while not self._stopping.is_set():
            with anyio.move_on_after(period):
                await self._stopping.wait()
            if self._stopping.is_set():
                return
            try:
                await self._reclaim(calls)
            except (ConnectionLost, ReplyError) as exc:
                log.warning("reclaim failed: %s", exc, extra={"event": "bus.reclaim_failed"})

    async def _reclaim(self, calls: TaskGroup) -> None:
        cursor = "0-0"
        while True:
            room = self.options.concurrency - self._in_flight
            if room <= 0:  # full: the next round takes them
                return
            next_cursor, entries, *rest = await self.conn.execute(
                "XAUTOCLAIM", self.bus.stream, self.bus.group, self.consumer,
                self.options.visibility_timeout_ms, cursor, "COUNT", min(256, room))
            if entries:
                log.info("reclaimed entries of a dead consumer", extra={
                    "event": "bus.reclaim", "service": self.bus.service, "count": len(entries)})
                self._spawn(calls, entries)
            for entry_id in rest[0] if rest else []:
                self._queue(b"", None, entry_id, None)  # deleted from the stream meanwhile
            if next_cursor in (b"0-0", "0-0"):
                return
            cursor = next_cursor

    def _parse(self, entry_id: bytes, flat: list[bytes]
               ) -> tuple[Call | None, bytes, str | None, StateError | None]:
        """An entry as a Call, or the error it gets. A call whose reply list is not one of
        this prefix's is not run at all (and its reply is not written: `_queue`)."""
        call, reply_key, call_id, error = parse_entry(entry_id, flat, self.options)
        if call is not None and reply_key and not self.bus.reply_allowed(reply_key):
            return None, reply_key, call_id, InvalidRequest(
                f"reply: must be a list key under {self.bus.reply_prefix}", {"field": "reply"})
        return call, reply_key, call_id, error

    # ---- serving one call --------------------------------------------------------------------
    async def _serve(self, entry_id: bytes, flat: list[bytes]) -> None:
        try:
            call, reply_key, call_id, error = self._parse(entry_id, flat)
            if call is None:
                self._answer(reply_key, call_id, None, error, entry_id, None, None)
                return
            await self._run(call)
            await self._flush_all()
        finally:
            self._finished([entry_id])

    async def _run(self, call: Call) -> None:
        record = None
        if self.record_ttl_ms is not None and call.id is not None:
            record = self.bus.record(call.id)
            try:
                previous = await self.conn.execute("GET", record)
            except (ConnectionLost, ReplyError) as exc:
                # Not answered, not acknowledged: the entry stays pending for a reclaim.
                log.warning("reading a call record failed: %s", exc, extra={
                    "event": "call.record_failed", "call_id": call.id, "fn": call.fn})
                return
            if previous is not None:  # answered before: the same reply again, nothing re-run
                self._queue(call.reply, previous, call.entry_id, None)
                return
        result: bytes | None = None
        error: StateError | None = None
        try:
            self._check_deadline(call)
            assert self.handler is not None
            result = await self.handler(call)
        except StateError as exc:
            error = exc
        except Exception as exc:  # a bug must cost one call, not the service
            log.exception("call failed", extra={"event": "call.crashed", "call_id": call.id,
                                                "fn": call.fn})
            error = InternalError(f"{call.fn} failed inside the service: {type(exc).__name__}")
        self._answer(call.reply, call.id, result, error, call.entry_id, record, call.started,
                     call.fn)

    @staticmethod
    def _check_deadline(call: Call) -> None:
        if call.deadline_ms is not None and now_ms() > call.deadline_ms:
            raise deadline_exceeded(call.deadline_ms)

    def _answer(self, reply_key: bytes, call_id: str | None, result: bytes | None,
                error: StateError | None, entry_id: bytes, record: str | None,
                started: float | None, fn: str | None = None) -> None:
        if error is not None:
            # Bad requests are the caller's business: debug. The rest is worth a line.
            level = logging.DEBUG if error.code in ("INVALID_REQUEST", "UNKNOWN_FUNCTION",
                                                    "CONFLICT", "NOT_FOUND") else logging.INFO
            log.log(level, "call error", extra={"event": "call.error", "call_id": call_id,
                                                "fn": fn, "code": error.code,
                                                "error": error.message})
        self.stats.count(error.code if error else None, started)
        document = reply_document(call_id, result, error)
        self._queue(reply_key, document, entry_id, record)

    # ---- replying ----------------------------------------------------------------------------
    def _queue(self, reply_key: bytes, document: bytes | None, entry_id: bytes,
               record: str | None) -> None:
        if reply_key and not self.bus.reply_allowed(reply_key):
            log.warning("reply key refused: not under %s", self.bus.reply_prefix, extra={
                "event": "call.reply_refused", "reply": reply_key[:200].decode(errors="replace")})
            self.stats.pending["reply_refused"] += 1
            reply_key = b""
        self._outgoing.append((reply_key, document, entry_id, record))
        self._outgoing_ready.set()

    async def _flusher(self) -> None:
        while True:
            with anyio.move_on_after(FLUSH_EVERY_S):
                await self._outgoing_ready.wait()
            if self._outgoing:
                await self._flush_all()
            else:  # quiet: still bring the counters up to date
                await self._write_stats(force=True)

    async def _write_stats(self, force: bool) -> None:
        commands = self.stats.flush_commands(self.bus.stats_key, force=force)
        if commands:
            with contextlib.suppress(ConnectionLost):
                await self.conn.pipeline(commands)

    async def _flush_all(self) -> None:
        """Write what is queued, until nothing is. One flush at a time: a second caller waits
        for the running one and then writes what is left, so when it returns, every reply
        queued before the call is written (a call is finished only after that)."""
        async with self._flush_lock:
            while self._outgoing:
                batch, self._outgoing = self._outgoing, []
                self._outgoing_ready = anyio.Event()
                try:
                    await self._write(batch)
                except (ConnectionLost, ReplyError) as exc:
                    # Not acknowledged: the entries stay pending, answered after a reclaim.
                    log.warning("writing replies failed: %s", exc, extra={
                        "event": "bus.flush_failed", "count": len(batch)})

    async def _write(self, batch: list[Outgoing]) -> None:
        by_key: dict[bytes, list[bytes]] = defaultdict(list)
        commands: list[list[Arg]] = []
        for reply_key, document, _entry_id, record in batch:
            if document is None:
                continue
            if reply_key:
                by_key[reply_key].append(document)
            if record is not None:
                commands.append(["SET", record, document, "PX", self.record_ttl_ms or 0])
        for reply_key, documents in by_key.items():
            commands.append(["LPUSH", reply_key, *documents])
            commands.append(["PEXPIRE", reply_key, self.options.reply_ttl_ms])
        ids = [entry_id for _, _, entry_id, _ in batch]
        commands.append(["XACK", self.bus.stream, self.bus.group, *ids])
        commands.append(["XDEL", self.bus.stream, *ids])
        commands += self.stats.flush_commands(self.bus.stats_key)
        results = await self.conn.pipeline(commands)
        for command, result in zip(commands, results, strict=True):
            if isinstance(result, ReplyError):  # e.g. a reply key of another type
                log.warning("reply write failed: %s", result, extra={
                    "event": "bus.write_failed", "command": str(command[0])})

