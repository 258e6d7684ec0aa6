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

A run that dies between claim and keep (a crash, Redis away) leaves its claim: a retry within
CLAIM_MS is UNAVAILABLE, a later one runs the write again (as every call whose record is lost).
Before this, the binding was the digest alone and a retry ran the write again: a retried
delete-by-topic deleted the keys written with that topic since the first run.
"""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import StateError, Unavailable, error_from
from stateworker.keys import KeySpace
from stateworker.schemas.base import encoder
from stateworker.scripts.bindings import BIND, Call, bind_call, kept_call
from stateworker.scripts.library import Library
from stateworker.scripts.statuses import LUA_STATUS, Target, raise_for_status, script_reply
from stateworker.settings import Settings
from stateworker.transport.plans import Answered, Plan, RunsNow

CLAIM_MS = 60_000  # how long a run holds its id before a retry may take it over (a dead run)
_DUPLICATE, _RUNNING = LUA_STATUS["DUPLICATE"], 2
_RESULT, _ERROR = b"=", b"!"


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
        return _kept(library, claim, plan)

    return Plan([BIND.command(library, *claim)], claimed, checks_deadline=True)


def _kept(library: Library, claim: Call, plan: Plan) -> Plan:
    """`plan`, then its result (or the error it ended with) kept in place of `claim`."""
    def finish(replies: list[Any]) -> Any:
        try:
            out = plan.finish(replies)
        except StateError as exc:
            out = exc
        if isinstance(out, Plan):
            return _kept(library, claim, out)
        if isinstance(out, Answered):
            return out
        if isinstance(out, StateError):  # (raised or returned, the same)
            error = out
            if isinstance(error, Unavailable):
                raise error  # (Redis away: the steps may or may not have run; the claim stays)
            text = encoder.encode(error.to_dict())
            return Plan([BIND.command(library, *kept_call(claim, _ERROR + text))],
                        lambda _: _raise(error))
        # (a failed keep is not the call's failure: it ran; a retry after the claim runs again.
        # The result as made, so an in-process caller gets its Struct; a replay has its JSON.)
        result = out
        keep = kept_call(claim, _RESULT + encoder.encode(result))
        return Plan([BIND.command(library, *keep)], lambda _: result)

    return Plan(plan.commands, finish, plan.checks_deadline, plan.binds_call_id)


def _raise(exc: StateError) -> Any:
    raise exc


def _replayed(held: bytes) -> Any:
    """The reply a run kept: its result's JSON as it was sent, or its error raised again."""
    if held[:1] == _RESULT:
        return msgspec.Raw(held[1:])
    error = msgspec.json.decode(held[1:])
    raise error_from(error["code"], error["message"], error.get("details"))
