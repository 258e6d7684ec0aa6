"""`ReplyWriter`: the answering side of a `BusRuntime` (bus/runtime.py).

    answer   error logged, counted (bus/stats.py), reply document -> queue (answer_call: a
             Call's); a document over `max_reply_bytes`: CALL_TOO_LARGE instead
    queue    (reply key, reply document, entry id, call record, msgpack) kept until the next
             flush (a `fmt msgpack` call's reply is turned into msgpack there: its record
             keeps the JSON document, as every other)
    flush    queued replies -> LPUSH per reply list, PEXPIRE, the call records (SET) in one
             pipeline, then XACK, XDEL (of the entries whose writes Redis took) and the
             counters in a second; by the flusher task, or by the call at once

A user worker's call records are kept here both ways: written with the reply, and read back
(`replayed`) when a call is delivered again, so it gets its recorded reply rather than a second
run; `look_up` puts that read and the id's claim on the wire where the call was read. A
record is `<digest>\\n<reply document>` (the digest: SHA-1 of the call's fn and body).

`unanswered` says calls were left pending, unacknowledged (Redis away while answering them):
the runtime's reader reads its pending history again to answer them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any

import anyio

from stateworker.bus.formats import reply_msgpack
from stateworker.bus.protocol import Bus, BusOptions, Call, Ref, parse_reply, reply_document
from stateworker.bus.stats import FLUSH_EVERY_S, Stats
from stateworker.errors import CallIdReused, CallTooLarge, InternalError, StateError, shown
from stateworker.logs import repeats
from stateworker.transport.connection import RedisConnection
from stateworker.transport.retry import refused_for_now, transient_reason
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

log = logging.getLogger("stateworker.bus")

# A user worker's call record: its key and the call's digest (SHA-1 of fn and body), which
# the record keeps before its reply document (`<digest>\n<document>`).
Record = tuple[str, bytes]
# (reply key, reply document (JSON) or None, the entry (stream, id), record or None, whether
# the reply list gets it in msgpack)
Outgoing = tuple[bytes, bytes | None, Ref, Record | None, bool]


class ReplyWriter:
    """Queues the replies of one service's calls and writes them with their acknowledgements."""

    def __init__(self, conn: RedisConnection, bus: Bus, options: BusOptions, stats: Stats,
                 record_ttl_ms: int | None) -> None:
        self.conn = conn  # shared, pipelined
        self.bus = bus
        self.options = options
        self.stats = stats
        self.record_ttl_ms = record_ttl_ms  # set: replies are recorded here (user workers)
        self.unanswered = False  # calls were left pending (Redis away): read them again
        self._outgoing: list[Outgoing] = []
        self._outgoing_ready = anyio.Event()
        self._flush_lock = anyio.Lock()

    def answer(self, reply_key: bytes, call_id: str | None, result: bytes | None,
               error: StateError | None, ref: Ref, record: Record | None,
               started: float | None, fn: str | None = None, msgpack: bool = False) -> None:
        if error is not None:
            # Bad requests are the caller's business: debug. The rest is worth a line.
            level = logging.DEBUG if error.code in ("INVALID_REQUEST", "UNKNOWN_FUNCTION",
                                                    "CONFLICT", "NOT_FOUND") else logging.INFO
            log.log(level, "call error", extra={"event": "call.error", "call_id": call_id,
                                                "fn": fn, "code": error.code,
                                                "error": error.message})
        document = reply_document(call_id, result, error)
        if len(document) > self.options.max_reply_bytes:
            # (a reply Redis could not take: its LPUSH would drop the connection and leave the
            # call pending, run again and again; every function's reply, listings too)
            error = CallTooLarge(
                f"$: the reply would be {len(document)} bytes, more than the limit of "
                f"{self.options.max_reply_bytes} bytes of one reply (the bus's "
                "max_reply_bytes, below Redis's proto-max-bulk-len); nothing is returned: "
                "ask for less a call (fewer keys, smaller pages)",
                {"path": "$", "size": len(document), "limit": self.options.max_reply_bytes})
            # (once a window, as every line a caller's calls can make: logs.Repeats)
            repeats.log(log, logging.WARNING, "reply too large", extra={
                "event": "call.reply_too_large", "call_id": call_id, "fn": fn,
                "size": len(document)})
            document = reply_document(call_id, None, error)
        self.stats.count(error.code if error else None, started, fn)
        self.queue(reply_key, document, ref, record, msgpack)

    def answer_call(self, call: Call, result: bytes | None, error: StateError | None,
                    record: Record | None = None) -> None:
        """`answer` for a call as read: its reply list, id, entry, start, function, format."""
        self.answer(call.reply, call.id, result, error, call.ref, record, call.started, call.fn,
                    call.msgpack)

    def queue(self, reply_key: bytes, document: bytes | None, ref: Ref,
              record: Record | None, msgpack: bool = False) -> None:
        if reply_key and not self.bus.reply_allowed(reply_key):
            repeats.log(log, logging.WARNING, "reply key refused: not under %s",
                        self.bus.reply_prefix, extra={
                            "event": "call.reply_refused",
                            "reply": reply_key[:200].decode(errors="replace")})
            self.stats.pending["reply_refused"] += 1
            reply_key = b""
        self._outgoing.append((reply_key, document, ref, record, msgpack))
        self._outgoing_ready.set()

    def look_up(self, call: Call, record: Record, claim: bool = True
                ) -> asyncio.Future[list[Any]] | None:
        """`replayed`'s commands put on the wire now, in this tick (a call just read: its
        look-up and claim go out with the read, before the task that runs it starts); the
        future of their replies, for `replayed(..., sent=)`. None: not connected (then
        `replayed` sends them)."""
        return self.conn.send_pipeline(_look_up_commands(call, record, claim,
                                                         self.options.visibility_timeout_ms))

    async def replayed(self, call: Call, record: Record, claim: bool = True,
                       sent: asyncio.Future[list[Any]] | None = None) -> bool:
        """True when `call` needs no run: it ran before and is answered from its record
        (CALL_ID_REUSED when the record is another call's), it runs now elsewhere (its
        claim is found: acknowledged without a reply, the run answers), or its record could
        not be read (then it is left pending, to be read again). False: run it (`claim`:
        the id is claimed first, `SET <record> "<digest>\n@<entry>" NX PX <visibility
        timeout>`, so no other worker runs it meanwhile; the record written after the run
        replaces the claim. A run that dies leaves a claim naming its entry: that entry,
        served again (the consumer's history read again after a restart, or a reclaim),
        takes the claim over and runs; another entry of the id is a re-send, not run).
        `sent`: these commands already on the wire (`look_up`, with the same `claim`)."""
        claimed = record[1] + b"\n@" + _entry_name(call.ref)
        try:
            results = await (sent if sent is not None else self.conn.pipeline(
                _look_up_commands(call, record, claim, self.options.visibility_timeout_ms)))
            failed = next((r for r in results if isinstance(r, ReplyError)), None)
            if failed is not None:
                raise failed
        except (ConnectionLost, ReplyError) as exc:
            # Not answered, not acknowledged: the entry stays pending, to be read again.
            repeats.log(log, logging.WARNING, "reading a call record failed: %s", exc, extra={
                "event": "call.record_failed", "call_id": call.id, "fn": call.fn})
            self.unanswered = True
            return True
        if claim and results[0] is not None:
            return False  # claimed: run it
        previous = results[-1]
        if previous is None:
            if claim:  # (the claim or record expired between the SET and the GET)
                self.unanswered = True  # left pending: read again
                return True
            return False
        assert isinstance(previous, bytes)
        # Answered before: the same reply again, nothing re-run.
        digest, document = (b"", previous) if previous[:1] == b"{" else (
            previous.partition(b"\n")[::2])  # (a record without digest: older)
        if document == claimed[len(record[1]) + 1:] and digest == record[1]:
            # This very entry claimed it, and its run ended without a record (its worker
            # died): served again, it runs again (at least once), the claim taken over.
            return await self._take_over(call, record, claimed) if claim else False
        if not document or document[:1] == b"@":  # a claim: the call runs now elsewhere
            self.duplicate(call, record, digest)
            return True
        if digest and digest != record[1]:  # the id of another call: not this one's
            self._reused(call)
            return True
        self.queue(call.reply, document, call.ref, None, call.msgpack)
        return True

    async def _take_over(self, call: Call, record: Record, claimed: bytes) -> bool:
        """The claim of a run that died, renewed for this one: False (run it), or True when
        Redis could not be asked (left pending, read again)."""
        try:
            await self.conn.execute("SET", record[0], claimed, "XX", "PX",
                                    self.options.visibility_timeout_ms)
        except (ConnectionLost, ReplyError) as exc:
            repeats.log(log, logging.WARNING, "renewing a call's claim failed: %s", exc, extra={
                "event": "call.record_failed", "call_id": call.id, "fn": call.fn})
            self.unanswered = True
            return True
        return False

    async def release(self, record: Record) -> None:
        """Drop the claim of a run cut off (the worker's stop): the entry stays pending, and
        whoever serves it again runs it. A claim not dropped (Redis away) expires with the
        visibility timeout."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(1), \
                contextlib.suppress(ConnectionLost, ReplyError):
            await self.conn.execute("DEL", record[0])

    def duplicate(self, call: Call, record: Record, running: bytes) -> None:
        """An entry of a call id that runs now (digest `running`): acknowledged without a
        reply (the run answers the caller, who matches replies by id); CALL_ID_REUSED when
        it is another call (another function or body)."""
        if running and running != record[1]:
            self._reused(call)
        else:
            self.queue(b"", None, call.ref, None)

    def _reused(self, call: Call) -> None:
        self.answer_call(call, None, CallIdReused(
            f"id {shown(call.id)} was used for another call (another function or body) in the "
            f"last {(self.record_ttl_ms or 0) // 1000} s; a retry must repeat the same "
            "call, a new call needs a new id", {"id": call.id}))

    async def flusher(self) -> None:
        while True:
            with anyio.move_on_after(FLUSH_EVERY_S):
                await self._outgoing_ready.wait()
            if self._outgoing:
                await self.flush_all()
            else:  # quiet: still bring the counters up to date
                await self.write_stats(force=True)

    async def write_stats(self, force: bool) -> None:
        commands = self.stats.flush_commands(self.bus.stats_key, force=force)
        if commands:
            with contextlib.suppress(ConnectionLost):
                await self.conn.pipeline(commands)

    async def flush_all(self) -> None:
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
                    # Not acknowledged: the entries stay pending and are read again.
                    log.warning("writing replies failed: %s", exc, extra={
                        "event": "bus.flush_failed", "count": len(batch)})
                    self.unanswered = True
                except Exception:  # a bug costs these replies (read again), not the service
                    log.exception("writing replies failed", extra={
                        "event": "bus.flush_crashed", "count": len(batch)})
                    self.unanswered = True

    async def _write(self, batch: list[Outgoing]) -> None:
        """The replies and records first, then the acknowledgements of the entries whose
        writes Redis took: one refused for now (out of memory, BUSY ...) leaves its entry
        pending, read again, rather than acknowledged without its reply. (One pipeline
        would not do: at `maxmemory` Redis refuses the SET and LPUSH but runs XACK and XDEL.)
        The caller sees its reply after the first round trip, as before."""
        by_key: dict[bytes, list[tuple[int, bytes]]] = defaultdict(list)
        writes: list[list[Arg]] = []
        owners: list[list[int]] = []  # per write: the batch's entries that wait for it
        for index, (reply_key, document, _ref, record, msgpack) in enumerate(batch):
            if document is None:
                continue
            if reply_key:
                by_key[reply_key].append((index, _msgpack(document) if msgpack else document))
            if record is not None:
                writes.append(["SET", record[0], record[1] + b"\n" + document, "PX",
                               self.record_ttl_ms or 0])
                owners.append([index])
        for reply_key, documents in by_key.items():
            writes.append(["LPUSH", reply_key, *(document for _, document in documents)])
            owners.append([index for index, _ in documents])
            writes.append(["PEXPIRE", reply_key, self.options.reply_ttl_ms])
            owners.append([])
        written = await self.conn.pipeline(writes) if writes else []
        held = {index for result, waiting in zip(written, owners, strict=True)
                if refused_for_now(result) for index in waiting}
        by_stream: dict[str, list[bytes]] = defaultdict(list)
        for index, (_, _, (stream, entry_id), _, _) in enumerate(batch):
            if index not in held:
                by_stream[stream].append(entry_id)
        acks: list[list[Arg]] = []
        for stream, ids in by_stream.items():
            acks.append(["XACK", stream, self.bus.group, *ids])
            acks.append(["XDEL", stream, *ids])
        acks += self.stats.flush_commands(self.bus.stats_key)
        commands = writes + acks
        results = written + (await self.conn.pipeline(acks) if acks else [])
        failed = [(command, result) for command, result in zip(commands, results, strict=True)
                  if isinstance(result, ReplyError)]  # e.g. a reply key of another type
        if failed:
            # (a reply list's name holding another type: counted as a refused reply list)
            self.stats.pending["reply_refused"] += sum(
                1 for command, result in failed
                if command[0] == "LPUSH" and str(result).startswith("WRONGTYPE"))
            command, result = failed[0]
            repeats.log(log, logging.WARNING, "reply write failed: %s", result, extra={
                "event": "bus.write_failed", "command": str(command[0]), "failed": len(failed),
                "held": len(held)})
            if held or any(transient_reason(result) for _, result in failed):
                self.unanswered = True  # not acknowledged: read them again



def _msgpack(document: bytes) -> bytes:
    """A reply document in msgpack; a document that cannot be turned into msgpack (a bug:
    formats.reply_msgpack takes every JSON reply) costs its call an INTERNAL reply, not the
    service (its flusher would die with it, and again each time the entry is read)."""
    try:
        return reply_msgpack(document)
    except Exception:
        log.exception("a reply could not be encoded as msgpack", extra={
            "event": "call.reply_unencodable"})
        parsed = parse_reply(document)
        return reply_msgpack(reply_document(
            parsed.id if parsed is not None else None, None,
            InternalError("the reply could not be encoded as msgpack")))


def _look_up_commands(call: Call, record: Record, claim: bool, claim_ms: int
                      ) -> list[list[Arg]]:
    """A call's id claimed for `claim_ms` unless taken (`replayed`), then its record read."""
    commands: list[list[Arg]] = [["GET", record[0]]]
    if claim:
        commands.insert(0, ["SET", record[0], record[1] + b"\n@" + _entry_name(call.ref),
                            "NX", "PX", claim_ms])
    return commands


def _entry_name(ref: Ref) -> bytes:
    """A stream entry as a claim names it: `<stream> <entry id>`."""
    return ref[0].encode() + b" " + ref[1]
