"""Leased triggers: `state::keep-trigger` renews one, and the reaper removes the expired ones.

A trigger registered with `ttl_ms` (state/reactive/triggers.py) carries `expires_at` in its
registration and its expiry (ms) in `KeySpace.trigger_leases`, the reaper's index; both
change together, in one script (`lua/keeptrigger.lua`). Keeping it is two steps, as the
registration's JSON is rewritten here, never by Lua (cjson would re-encode its values): read
it, then the script renews it only if it is still what was read (else read again). Like an
etcd lease's keepalive: an unknown or expired id is NOT_FOUND (register it again), and each
renewal is the registry entry every replica's dispatcher and the snapshot follow.
"""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.clock import now_ms, rfc3339_ms
from stateworker.context import CallContext
from stateworker.errors import Conflict, InvalidRequest, NotFound, shown
from stateworker.schemas import KeepTriggerRequest, KeptResult, Trigger
from stateworker.scripts.bindings import KEEP_TRIGGER, keep_trigger_call
from stateworker.scripts.replies import KeptReply
from stateworker.scripts.upkeep_bindings import reap_triggers_call
from stateworker.state.core import guard
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import trigger_checks, triggers
from stateworker.transport.plans import Plan, command_reply

KEEP_ATTEMPTS = 5  # reads again when the registration changed in between, at most
REAP_BATCH = 200  # expired triggers removed per script call

_encoder = msgspec.json.Encoder()


def _gone(trigger_id: str) -> NotFound:
    return NotFound(f"$.id: no trigger {shown(trigger_id)} is registered, or its lease "
                    "(ttl_ms) expired; register it again", {"path": "$.id", "id": trigger_id})


def _renewed(state: RedisState, req: KeepTriggerRequest, ctx: CallContext, held: Any,
             now: int) -> tuple[Trigger, int]:
    """The registration read (`held`, raw), checked and renewed; with its new expiry (ms)."""
    if held is None:
        raise _gone(req.id)
    trigger = triggers.decode_trigger(held)
    if not triggers.live(trigger, now):
        raise _gone(req.id)
    if trigger.ttl_ms is None:
        raise InvalidRequest(
            f"$.id: trigger {shown(req.id)} was registered without ttl_ms: it never expires, "
            "so there is no lease to keep (register it with ttl_ms for one)",
            {"path": "$.id", "id": req.id})
    if ctx.principal is not None and not guard.may_administer(state, ctx) \
            and trigger.owner != ctx.principal:
        raise triggers.not_the_owner(ctx, req.id, trigger.owner or "", "keeps")
    expires = now + (req.ttl_ms if req.ttl_ms is not None else trigger.ttl_ms)
    return msgspec.structs.replace(trigger, expires_at=rfc3339_ms(expires)), expires


def keep_plan(state: RedisState, req: KeepTriggerRequest, ctx: CallContext,
              attempt: int = 1) -> Plan:
    trigger_checks.checked_id(req.id)
    trigger_checks.checked_ttl(req.ttl_ms)

    def renew(replies: list[Any]) -> Plan:
        held = command_reply(replies[0], "reading the trigger")
        now = now_ms()
        trigger, expires = _renewed(state, req, ctx, held, now)

        def finish(reply: KeptReply) -> Any:
            if reply.changed:  # replaced meanwhile: judge the registration as it is now
                if attempt >= KEEP_ATTEMPTS:
                    raise Conflict(f"$.id: trigger {shown(req.id)} changed {attempt} times "
                                   "while it was being kept; nothing was renewed",
                                   {"path": "$.id", "id": req.id})
                return keep_plan(state, req, ctx, attempt + 1)
            if not reply.done:
                raise _gone(req.id)
            return KeptResult(req.id, trigger.expires_at or "")

        call = keep_trigger_call(state.keys, now, req.id, held, _encoder.encode(trigger),
                                 expires)
        return state.script_plan(KEEP_TRIGGER, call, finish)

    return Plan([["HGET", state.keys.triggers, req.id]], renew)


def state_keep_trigger(state: RedisState, req: KeepTriggerRequest, ctx: CallContext) -> Plan:
    return keep_plan(state, req, ctx)


def reap_plan(state: RedisState) -> Plan:
    """Remove up to REAP_BATCH triggers whose lease expired by now: a KeptReply (`more`:
    others are due)."""
    call = reap_triggers_call(state.keys, now_ms(), REAP_BATCH)
    return state.script_plan(KEEP_TRIGGER, call, lambda reply: reply)


async def reap_triggers(state: RedisState) -> int:
    """Remove every trigger whose lease expired by now; returns how many."""
    total, more = 0, True
    while more:
        done: KeptReply = await state.execute(reap_plan(state))
        total, more = total + done.done, done.more
    return total
