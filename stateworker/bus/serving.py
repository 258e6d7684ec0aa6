"""`Serving`: how a `BusRuntime` (bus/runtime.py) serves the calls its reader hands it, from the
entry read to the reply queued (bus/reply_writer.py writes it):

    batch    the state service's: every entry parsed and checked, each call made a plan, the
             first step of all plans sent as one pipeline right where they were read; one
             task waits for them, and answers each call as its plan finishes
    handler  a user worker's: one task per call; its id looked up and claimed in the call
             records right where it was read, before its task starts (`_begin`: the claim's
             round trip overlaps the wait for the task's first turn; a re-send of an id
             running here waits for the first run's reply), a late call refused, the
             handler run, its reply recorded and queued

A mixin of `BusRuntime`, which holds the state it uses (declared below for the type checker)
and calls `_finished` when a batch or a call is done. A malformed entry is answered with its
error here (`_refuse`); a call that met Redis away, or Redis full (`RedisFull`), is left
pending, for the reader (its history read again) or a reclaim to serve again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from stateworker import tracing
from stateworker.bus.entries import Parsed
from stateworker.bus.protocol import BatchHandler, Bus, BusOptions, Call, Handler, Ref
from stateworker.bus.reply_writer import Record, ReplyWriter
from stateworker.bus.sources import Source, Sources, read_call
from stateworker.clock import now_ms
from stateworker.errors import InternalError, StateError, Unavailable, deadline_exceeded
from stateworker.transport.plans import REPLIED, Answered, Plan, RedisFull, RunsNow, Sent

log = logging.getLogger("stateworker.bus")


class LookUp(NamedTuple):
    """What `_look_up` found of a call at its read: late (its deadline passed), its record
    (None: not recorded), its id's look-up and claim on the wire (None: not sent)."""

    late: bool
    record: Record | None
    sent: asyncio.Future[list[Any]] | None


class Serving:
    """A `BusRuntime`'s way of serving a batch of plans, or one handler call."""

    bus: Bus
    options: BusOptions
    sources: Sources
    replies: ReplyWriter
    handler: Handler | None
    batch: BatchHandler | None
    _running_ids: dict[str, bytes]

    if TYPE_CHECKING:  # (BusRuntime's: a batch or a call is done, its slots free)
        def _finished(self, refs: list[Ref]) -> None: ...

    def _prepare_batch(self, entries: list[tuple[Ref, list[bytes], Source]]
                       ) -> list[tuple[Call, Plan]]:
        """Calls as plans; a malformed or late call is answered (queued) here."""
        assert self.batch is not None
        replies = self.replies
        in_script = self.batch.answers_in_script
        ready: list[tuple[Call, Plan]] = []
        for ref, flat, source in entries:
            call, reply_key, call_id, error, msgpack = self._parse(ref, flat, source, in_script)
            if call is None:
                self._refuse(reply_key, call_id, error, ref, msgpack)
                continue
            if tracing.TRACEPARENT in call.ctx.context:  # (an untraced call costs this lookup only)
                call.span, call.ctx = tracing.start_call(call.fn, call.ctx, call.id)
            try:
                # The deadline is checked by the plan: a call that was applied before its
                # deadline passed must still get its recorded reply when delivered again.
                ready.append((call, self.batch.prepare(call)))
            except StateError as exc:
                if call.span is not None:
                    tracing.finish(call.span, exc.code)
                replies.answer_call(call, None, exc)
            except Exception as exc:  # a bug costs one call, not the batch
                log.exception("preparing a call failed", extra={
                    "event": "call.crashed", "call_id": call.id, "fn": call.fn})
                if call.span is not None:
                    tracing.finish(call.span, InternalError.code)
                replies.answer_call(call, None, InternalError(
                    f"{call.fn} failed inside the service: {type(exc).__name__}"))
        return ready

    async def _serve_batch(self, ready: list[tuple[Call, Plan]], sent: Sent,
                           refs: list[Ref]) -> None:
        """Wait for a batch's plans (every step of all calls in one pipeline); each call is
        answered when its plan is done, and the replies are written after every step."""
        assert self.batch is not None
        replies = self.replies
        answer_call = replies.answer_call

        def done(index: int, result: Any) -> None:
            call = ready[index][0]
            if call.span is not None:
                tracing.finish(call.span, result.code if isinstance(result, StateError)
                               else tracing.OK)
            if isinstance(result, Unavailable | RedisFull):
                # Redis went away mid-call: the script may have run. Or Redis, full, refused
                # the script before it could find the call's record: the call may have run
                # before (a delivery again, a re-send), so RESOURCE_EXHAUSTED ("nothing was
                # written") would be false of it. No reply, no ack: the entry stays pending,
                # and the reader (or a reclaim) serves it again, which answers it from the
                # call's record. A call that runs now under its id's claim (a re-send) waits
                # for a reclaim alone: the reader's pause and history would hold up every
                # other call for as long as the claim lives.
                if not isinstance(result, RunsNow):
                    replies.unanswered = True
                return
            if isinstance(result, Answered):  # its script wrote the reply (and acknowledged)
                replies.stats.count(None, call.started, call.fn)
                if result is REPLIED:  # (the entry's stream on another node: acknowledged here)
                    replies.queue(b"", None, call.ref, None)
            elif isinstance(result, StateError):
                answer_call(call, None, result)
            else:
                answer_call(call, result, None)

        try:
            if ready:
                await self.batch.execute_many([plan for _, plan in ready], sent, done,
                                              replies.flush_all)
            await replies.flush_all()  # at once, rather than a loop iteration later
        finally:
            self._finished(refs)

    def _parse(self, ref: Ref, flat: list[bytes], source: Source,
               in_script: frozenset[str] = frozenset()) -> Parsed:
        return read_call(ref, flat, self.options, self.bus, self.sources, source, in_script)

    def _refuse(self, reply_key: bytes, call_id: str | None, error: StateError | None,
                ref: Ref, msgpack: bool) -> None:
        """An entry that is not run: answered with its error (acknowledged without a reply
        when it gets none: a reply list it may not use)."""
        if error is None:
            self.replies.queue(b"", None, ref, None)
        else:
            self.replies.answer(reply_key, call_id, None, error, ref, None, None,
                                msgpack=msgpack)

    # ---- serving one call --------------------------------------------------------------------
    def _begin(self, calls: TaskGroup, ref: Ref, flat: list[bytes], source: Source) -> None:
        """One call read: parsed, its id looked up and claimed right here (`_look_up`), then
        run in a task of its own. The claim's round trip so overlaps the wait for the task's
        first turn, which on a busy loop is as long: a trigger's handler starts 1.02 -> 0.71
        ms after the read at the median, 1,000 calls/s (docs/performance.md, "hop by hop");
        the calls of one read share one write."""
        parsed = self._parse(ref, flat, source)
        look_up = None if parsed[0] is None else self._look_up(parsed[0])
        calls.start_soon(self._serve, ref, parsed, look_up)

    def _look_up(self, call: Call) -> LookUp:
        """Whether the call is late, its record, and (recorded calls: user workers) its id's
        look-up and claim on the wire (`ReplyWriter.look_up`; not for an id that runs here
        now: its entry is a re-send, which only the first run answers). Redis runs the
        claims in the order the calls were read, so of two entries of one id only the first
        read claims it."""
        late = call.deadline_ms is not None and now_ms() > call.deadline_ms
        if self.replies.record_ttl_ms is None or call.id is None:
            return LookUp(late, None, None)
        record = (self.bus.record(call.id), (call.ctx.call_digest or "").encode())
        # (a late call is only looked up: its DEADLINE_EXCEEDED is not recorded, the id
        # stays free)
        sent = None if record[0] in self._running_ids else self.replies.look_up(
            call, record, claim=not late)
        return LookUp(late, record, sent)

    async def _serve(self, ref: Ref, parsed: Parsed, look_up: LookUp | None) -> None:
        try:
            call, reply_key, call_id, error, msgpack = parsed
            if call is None:
                self._refuse(reply_key, call_id, error, ref, msgpack)
                return
            assert look_up is not None
            await self._run(call, look_up)
            await self.replies.flush_all()
        finally:
            self._finished([ref])

    async def _run(self, call: Call, look_up: LookUp) -> None:
        replies = self.replies
        late, record, sent = look_up
        if record is not None:
            running = self._running_ids.get(record[0])
            if running is not None and sent is None:  # the same id runs here: it answers
                replies.duplicate(call, record, running)
                return
            # Looked up, and (when it is to run) claimed for the visibility timeout, so no
            # other worker runs it meanwhile. A claim sent at the read is Redis's to decide
            # (one that won runs, even if another entry of the id started here since).
            if sent is not None and sent.done():
                # Answered before this task's first turn: the task of a call read before it
                # may be waiting on a claim answered in the same reply, its wake-up queued
                # behind this turn. One turn given up lets it start first: handlers start
                # in the order their calls were read (a scope's trigger deliveries).
                await anyio.lowlevel.checkpoint()
            if await replies.replayed(call, record, claim=not late, sent=sent):
                return
        if late:  # (not recorded: sent again with a later deadline, it runs)
            assert call.deadline_ms is not None
            replies.answer_call(call, None, deadline_exceeded(call.deadline_ms))
            return
        result: bytes | None = None
        error: StateError | None = None
        if record is not None:
            self._running_ids[record[0]] = record[1]
        try:
            assert self.handler is not None
            result = await self.handler(call)
        except StateError as exc:
            error = exc
        except Exception as exc:  # a bug must cost one call, not the service
            log.exception("call failed", extra={"event": "call.crashed", "call_id": call.id,
                                                "fn": call.fn})
            error = InternalError(f"{call.fn} failed inside the service: {type(exc).__name__}")
        except anyio.get_cancelled_exc_class():
            if record is not None:  # (cut off at the stop: the id free again, for the
                await replies.release(record)  # entry left pending, when read again)
            raise
        finally:
            if record is not None:
                self._running_ids.pop(record[0], None)
        replies.answer_call(call, result, error, record)
