"""A write that runs no entry script, run at most once per call id (docs/bus-protocol.md, "The
identity of a call, and retries"): delete-by-topic, the barriers, the indexes, the triggers,
the namespaces, the live settings.

An entry script binds its call id and records its reply in the same script that applies it.
These writes run as steps of their own (several scripts, or Python between them), so their
binding (bind.lua) is made in three moves:

- **claim** ("w"), a step before the write: the id bound to the call's digest with a claim
  until now + CLAIM_MS. A record of the same call answers at once (its reply, nothing run); a
  live claim of the same call means it runs now (another replica, the other door, a re-send):
  UNAVAILABLE (RunsNow), run nothing (over the bus the entry stays pending, and a reclaim
  serves it again, then from the record; no other call waits for it); another call's
  binding: CALL_ID_REUSED. The deadline is checked after the
  record: a call applied in time is answered the same when it comes again late.
- the write's own steps;
- **keep** ("k"), a step after: its JSON result, or the error it ended with, replaces the
  claim, for the rest of the window.

A run that dies between claim and keep (a crash, Redis away or out of memory: UNAVAILABLE,
RESOURCE_EXHAUSTED) leaves its claim: a retry within CLAIM_MS is UNAVAILABLE, a later one runs
the write again (as every call whose record is lost). A run that a Redis which lost the
prefix's data refused (STORE_LOST) keeps no reply and lets its claim go: what it may have run
is gone once Redis is recovered (a restore rebuilds an emptied Redis), so the retry after the
recovery runs the write (kept, that answer would have answered every retry of the window).
Before this, the binding was the digest alone and a retry ran the write again: a retried
delete-by-topic deleted the keys written with that topic since the first run.

With the snapshot on, the keep also appends the record to the unsaved kept replies of the
id's home partition, with what PostgreSQL must hold before the record may go there (`Needs`,
decision 0061): a record there without its writes would answer a retry after a restore that
lost them, without applying it. Each step's scripts say how PostgreSQL holds their writes
(`Binding.held`): through a stream the snapshot follows (a partition's events, the registry:
the stream's last entry, read after the last step, is the position its commit must reach),
or a barrier's mark in its partition's changed set (gone once stored). A step write that ran
a script whose writes PostgreSQL never holds (the live settings) keeps its reply in Redis
alone: a retry after a restore runs it again, as it must. (A step's plain commands are reads,
or a trigger's consumer groups, which the dispatcher makes again.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import ResourceExhausted, StateError, StoreLost, Unavailable, error_from
from stateworker.keys import KeySpace, call_field
from stateworker.schemas.base import encoder
from stateworker.scripts.bindings import BIND, BINDINGS, Call, bind_call, kept_call
from stateworker.scripts.library import FCALL, Binding, Library
from stateworker.scripts.statuses import LUA_STATUS, Target, raise_for_status, script_reply
from stateworker.settings import Settings
from stateworker.transport.plans import Answered, Plan, RunsNow

CLAIM_MS = 60_000  # how long a run holds its id before a retry may take it over (a dead run)
_DUPLICATE, _RUNNING = LUA_STATUS["DUPLICATE"], 2
_RESULT, _ERROR = b"=", b"!"
_BY_NAME: dict[str, Binding[Any]] = {b.name: b for b in BINDINGS}


class Needs(msgspec.Struct, array_like=True, frozen=True):
    """What PostgreSQL must hold before a kept reply goes there (snapshot/kept.py): every
    `positions` hash (a partition's `snapshotted`, the registry's) at or past its revision
    ("<ms>-<seq>"), and no barrier hash of `unmarked` left in its changed set: (set, hash)."""

    positions: list[tuple[str, str]]
    unmarked: list[tuple[str, str]]


@dataclass(slots=True)
class _Writes:
    """What one run's steps wrote, by how PostgreSQL holds it (library.Held)."""

    streams: set[str] = field(default_factory=set)
    marked: set[tuple[str, str]] = field(default_factory=set)
    unheld: bool = False  # a script whose writes PostgreSQL never holds

    def add(self, space: KeySpace, library: Library, commands: list[list[Any]]) -> None:
        for command in commands:
            if not command or command[0] != FCALL:
                continue
            binding = _BY_NAME.get(str(command[1])[len(library.library) + 1:])
            held = None if binding is None else binding.held
            names = [str(k) for k in command[3:3 + int(command[2])]]
            if held is None:
                self.unheld = True
            elif held.kind == "stream":
                self.streams.add(names[held.key - 1])
                self.unheld |= space.snapshotted_of(names[held.key - 1]) is None
            elif held.kind == "marked":
                self.marked.add((names[held.mark - 1], names[held.key - 1]))


@dataclass(slots=True)
class _Run:
    """One run of a step write: where its claim is, and what its steps wrote."""

    settings: Settings
    space: KeySpace
    library: Library
    ctx: CallContext
    claim: Call
    writes: _Writes = field(default_factory=_Writes)

    def keep(self, reply: bytes, then: Callable[[list[Any]], Any]) -> Plan:
        """The reply kept in place of the claim (with the snapshot on, and every write held
        by PostgreSQL, for PostgreSQL too, once the streams' last entries are read), then
        `then`."""
        writes = self.writes
        if not self.settings.postgres_url or writes.unheld:
            return Plan([BIND.command(self.library, *kept_call(self.claim, reply))], then)
        streams = sorted(writes.streams)

        def noted(replies: list[Any]) -> Plan:
            if not all(isinstance(last, list) for last in replies):  # (not read: Redis only)
                return Plan([BIND.command(self.library, *kept_call(self.claim, reply))], then)
            positions = []
            for stream, last in zip(streams, replies, strict=True):
                mirror = self.space.snapshotted_of(stream)
                if last and mirror is not None:  # (no entry: nothing written there)
                    positions.append((mirror, last[0][0].decode()))
            needs = Needs(positions, sorted(writes.marked))
            home = self.space.partition(self.space.id_home(call_field(self.ctx.call_id or "")))
            call = kept_call(self.claim, reply, (home.unsaved_kept, self.settings.events_maxlen,
                                                 msgspec.msgpack.encode(needs)))
            return Plan([BIND.command(self.library, *call)], then)

        if not streams:
            return noted([])
        return Plan([["XREVRANGE", stream, "+", "-", "COUNT", 1] for stream in streams], noted)


def run_once(settings: Settings, space: KeySpace, library: Library, ctx: CallContext,
             cluster: bool, plan: Plan) -> Plan:
    """`plan` (a write whose steps record nothing), run only when its id is free, its reply
    kept in its binding; a retry gets that reply. The plan checks the deadline (bind.lua)."""
    claim_end = now_ms() + CLAIM_MS
    claim = bind_call(settings, space, ctx, cluster, "w", claim_end,
                      "" if ctx.deadline_ms is None else ctx.deadline_ms)

    def claimed(replies: list[Any]) -> Any:
        reply = script_reply(replies[0], BIND.name)
        raise_for_status(reply, Target(settings, "", "", ctx))
        if reply[0] == _DUPLICATE:
            return _replayed(reply[1])
        if reply[1] == _RUNNING:
            raise RunsNow(
                f"id: the call {ctx.call_id!r} runs now (sent again while it runs, here or on "
                f"another replica, for at most {CLAIM_MS // 1000} s); it is not run twice: "
                "send it again to get its reply", {"path": "id", "call_id": ctx.call_id,
                                                   "limit_ms": CLAIM_MS})
        return _kept(_Run(settings, space, library, ctx, claim), plan)

    return Plan([BIND.command(library, *claim)], claimed, checks_deadline=True)


def _kept(run: _Run, plan: Plan) -> Plan:
    """`plan`, then its result (or the error it ended with) kept in place of the claim."""
    run.writes.add(run.space, run.library, plan.commands)

    def finish(replies: list[Any]) -> Any:
        try:
            out = plan.finish(replies)
        except StateError as exc:
            out = exc
        if isinstance(out, Plan):
            return _kept(run, out)
        if isinstance(out, Answered):
            return out
        if isinstance(out, StateError):  # (raised or returned, the same)
            error = out
            if isinstance(error, Unavailable | ResourceExhausted):
                raise error  # (Redis away or full: the steps may or may not have run; the
                # claim stays, and a retry after it runs the write again)
            if isinstance(error, StoreLost):  # (no reply: what it ran, if anything, is gone
                # once Redis is recovered, by a restore into an emptied Redis; the claim let go)
                return Plan([BIND.command(run.library, *kept_call(run.claim, b"", mode="u"))],
                            lambda _: _raise(error))
            return run.keep(_ERROR + encoder.encode(error.to_dict()), lambda _: _raise(error))
        # (a failed keep is not the call's failure: it ran; a retry after the claim runs again.
        # The result as made, so an in-process caller gets its Struct; a replay has its JSON.)
        result = out
        return run.keep(_RESULT + encoder.encode(result), lambda _: result)

    return Plan(plan.commands, finish, plan.checks_deadline, plan.binds_call_id)


def _raise(exc: StateError) -> Any:
    raise exc


def _replayed(held: bytes) -> Any:
    """The reply a run kept: its result's JSON as it was sent, or its error raised again."""
    if held[:1] == _RESULT:
        return msgspec.Raw(held[1:])
    error = msgspec.json.decode(held[1:])
    raise error_from(error["code"], error["message"], error.get("details"))
