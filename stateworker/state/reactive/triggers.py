"""The trigger registry: `state::register-trigger`, `state::unregister-trigger`,
`state::list-triggers`.

A registration is stored as JSON in one hash (`keys.triggers`); `lua/trigger.lua` writes it and
appends a `kind triggers` entry naming its id to the registry stream in the same script, so
every replica's dispatcher rereads it within its follower's wake-up (reactive/trigger_reads.py).
Each owner (`acl` mode: the registering principal) holds a share of the registry,
MAX_OWNER_TRIGGERS and MAX_OWNER_TRIGGERS_BYTES, kept in `KeySpace.trigger_owners` by the
scripts (lua/includes/shares.lua, docs/decisions/0064). Everything a dispatcher needs to
evaluate a trigger is checked at registration (state/reactive/trigger_checks.py: the limits,
filters, condition and lease): a bad filter is refused with the field named, never found
later on an event. Its targets (`service`, `function_id`, a bus
condition's `condition_service` and `condition_function_id`) follow the bus's name rules
(keys.bus_name_problem; a service at most `MAX_SERVICE_BYTES`), and in `acl` mode the
registering principal must be one that may call the services (guard.may_call_service).
A registration starts where the streams of the partitions it covers end (`start_revisions`,
read in its first step, `_started`): the dispatcher hands it no event at or before them.

A trigger registered with `ttl_ms` is leased: its registration carries `expires_at`, renewed
by `state::keep-trigger` (state/reactive/trigger_leases.py), and once that time passes it is gone:
no event written from then on matches it (reactive/matching.py), `list-triggers` leaves it
out, trigger.lua treats it as absent, and the reaper removes it (`KeySpace.trigger_leases`).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from stateworker.clock import epoch_ms, now_ms, rfc3339_ms
from stateworker.context import CallContext
from stateworker.errors import InvalidRequest, PermissionDenied, shown
from stateworker.events.compaction import stream_info
from stateworker.events.model import revision_text
from stateworker.keys import MAX_FUNCTION_BYTES, MAX_SERVICE_BYTES, STATE_SERVICE, KeySpace, bus_shard_stream
from stateworker.schemas.kv import EmptyRequest
from stateworker.schemas.reactive import (
    RegisterTriggerRequest,
    Trigger,
    TriggerConfig,
    TriggerIdRequest,
    TriggerIdResult,
    TriggersResult,
    UnregisteredResult,
)
from stateworker.scripts.bindings import TRIGGER, trigger_call
from stateworker.scripts.replies import TriggerReply
from stateworker.settings import Settings
from stateworker.state.core import guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.reactive.trigger_checks import (
    MAX_OWNER_TRIGGERS,
    MAX_OWNER_TRIGGERS_BYTES,
    MAX_REGISTRATION_BYTES,
    MAX_TRIGGERS,
    MAX_TRIGGERS_BYTES,
    checked_config,
    checked_text,
    checked_ttl,
    may_target,
)
from stateworker.transport.plans import Plan, command_reply, then
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.state.reactive.triggers")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Trigger)


def expires_ms(trigger: Trigger) -> int | None:
    """When a leased trigger is gone (epoch ms); None: it never expires."""
    return None if trigger.expires_at is None else epoch_ms(trigger.expires_at)


def live(trigger: Trigger, now: int) -> bool:
    """Whether `trigger` is still registered at `now` (its lease, if any, not expired)."""
    until = expires_ms(trigger)
    return until is None or now < until


def register_plan(state: RedisState, req: RegisterTriggerRequest, ctx: CallContext) -> Plan:
    trigger_id = req.id if req.id is not None else f"t-{uuid.uuid4().hex}"
    checked_text("id", trigger_id)
    ttl_ms = checked_ttl(req.ttl_ms)
    validate.bus_target("function_id", req.function_id, MAX_FUNCTION_BYTES)
    validate.bus_target("service", req.service, MAX_SERVICE_BYTES)
    config = checked_config(state, req.config, req.service)
    may_target(state, ctx, "service", req.service)
    if config.condition_service is not None and config.condition_service != req.service:
        may_target(state, ctx, "config.condition_service", config.condition_service)
    guard.may_read(state, ctx, config.scope, "$.config.scope")  # (its events carry values)
    now = now_ms()
    expires = None if ttl_ms is None else now + ttl_ms
    trigger = Trigger(id=trigger_id, function_id=req.function_id, service=req.service,
                      config=config, created_at=rfc3339_ms(now) or "",
                      owner=ctx.principal, ttl_ms=ttl_ms, expires_at=rfc3339_ms(expires))
    size = len(_encoder.encode(trigger))  # (before its start_revisions: one per partition)
    if size > MAX_REGISTRATION_BYTES:
        raise InvalidRequest(f"$.config: the registration is {size} bytes of JSON, more than "
                             f"the limit of {MAX_REGISTRATION_BYTES} (every replica reloads "
                             "every registration)", {"path": "$.config", "size": size,
                                                     "limit": MAX_REGISTRATION_BYTES})

    def finish(reply: TriggerReply) -> TriggerIdResult:
        _not_anothers(ctx, trigger_id, reply)
        if reply.refused and reply.share_of is not None:
            raise _past_share(reply)
        if reply.refused and reply.bytes is not None:
            raise InvalidRequest(
                f"$.config: the registrations would hold {reply.bytes} bytes of JSON in all "
                f"with this one, more than the limit of {reply.limit} (every replica reloads "
                "every registration on each change); unregister some, or register smaller "
                "ones", {"path": "$.config", "size": reply.bytes, "limit": reply.limit,
                         "of": "all"})
        if reply.refused:
            raise InvalidRequest(f"$.id: {reply.registered} triggers are registered, the limit is "
                                 f"{MAX_TRIGGERS}; unregister some first",
                                 {"path": "$.id", "limit": MAX_TRIGGERS, "of": "all"})
        return TriggerIdResult(trigger_id)

    def store(started: Trigger) -> Plan:
        call = trigger_call(state.keys, "set", trigger_id, _encoder.encode(started),
                            MAX_TRIGGERS, ctx.principal, guard.may_administer(state, ctx),
                            now=now, expires=expires, cap_bytes=MAX_TRIGGERS_BYTES,
                            share=(MAX_OWNER_TRIGGERS, MAX_OWNER_TRIGGERS_BYTES))
        return then(state.script_plan(TRIGGER, call, finish),
                    functools.partial(with_groups, state, {req.service, config.condition_service}))

    return _started(state, trigger, store)


def _past_share(reply: TriggerReply) -> InvalidRequest:
    """A registration refused past its owner's share (trigger.lua): the owner's figures."""
    owner = shown(reply.share_of or "")
    if reply.over == "count":
        return InvalidRequest(
            f"$.id: principal {owner} has {reply.registered} triggers registered, the limit is "
            f"{reply.limit} an owner; unregister some of its own first",
            {"path": "$.id", "limit": reply.limit, "of": "owner", "owner": reply.share_of})
    return InvalidRequest(
        f"$.config: principal {owner}'s registrations would hold {reply.bytes} bytes of JSON "
        f"with this one, more than the limit of {reply.limit} an owner; unregister some of "
        "its own, or register smaller ones", {"path": "$.config", "size": reply.bytes,
                                              "limit": reply.limit, "of": "owner",
                                              "owner": reply.share_of})


def covered(keys: KeySpace, config: TriggerConfig) -> list[int]:
    """The partitions whose events a trigger can see: its scope's, or every one."""
    if config.scope is not None:
        return [keys.partition_of(config.scope)]
    return list(range(keys.partitions))


def _started(state: RedisState, trigger: Trigger,
             store: Callable[[Trigger], Plan]) -> Plan:
    """First step of a registration: the last revision of each partition it covers (as an
    etcd watch created now starts at the current revision), then `store(the trigger with
    its start_revisions)`. Each is read from its own stream (one key a command, so a
    partition in a slot of its own still fits); an event committed while the registration
    runs may be seen or not, one committed after its reply is seen."""
    partitions = covered(state.keys, trigger.config)
    streams = [state.keys.partition(p).events for p in partitions]

    def start(replies: list[Any]) -> Plan:
        ends = {}
        for partition, stream, reply in zip(partitions, streams, replies, strict=True):
            info = stream_info(reply, stream)
            ends[partition] = revision_text(info.last_generated) if info else "0-0"
        return store(msgspec.structs.replace(trigger, start_revisions=ends))

    return Plan([["XINFO", "STREAM", stream] for stream in streams], start)


def unregister_plan(state: RedisState, trigger_id: str, ctx: CallContext) -> Plan:
    checked_text("id", trigger_id)

    def finish(reply: TriggerReply) -> UnregisteredResult:
        _not_anothers(ctx, trigger_id, reply)
        return UnregisteredResult(trigger_id, reply.existed)

    call = trigger_call(state.keys, "del", trigger_id, "", MAX_TRIGGERS, ctx.principal,
                        guard.may_administer(state, ctx), now=now_ms())
    return state.script_plan(TRIGGER, call, finish)


def _not_anothers(ctx: CallContext, trigger_id: str, reply: TriggerReply) -> None:
    """`acl` mode: a principal replaces or removes only its own triggers (an admin any)."""
    if reply.owner is not None:
        raise not_the_owner(ctx, trigger_id, reply.owner)


def not_the_owner(ctx: CallContext, trigger_id: str, owner: str,
                  what: str = "replaces or removes") -> PermissionDenied:
    """PERMISSION_DENIED: trigger `trigger_id` is `owner`'s ("": ownerless), not the caller's."""
    whose = f"principal {shown(owner)}'s" if owner else "a trigger registered " \
        "with no owner (off mode), which only an admin may change"
    return PermissionDenied(
        f"$.id: trigger {shown(trigger_id)} is {whose}; principal {shown(ctx.principal)} "
        f"{what} only its own triggers", {"path": "$.id", "principal": ctx.principal,
                                          "owner": owner, "missing": "ownership of the trigger"})


def with_groups(state: RedisState, services: set[str | None], result: Any) -> Any:
    """After a registration: the consumer group of each service the trigger calls (its
    `service`, a bus condition's `condition_service`), made at `0` with its stream when
    missing (BUSYGROUP: there already), so a worker that starts later reads every call
    dispatched before it, whichever id it would have made the group at
    (docs/bus-protocol.md, "A worker's duties"). A group that cannot be made (the name holds
    another type) is logged; the registration stands. Then `result` (at once when the trigger
    calls only the state service, which makes its own group)."""
    names = sorted(s for s in services if s and s != STATE_SERVICE)
    if not names or state.split_bus:
        # (the bus on a Redis of its own: the dispatcher makes the groups there when it
        # loads the trigger, before its first call: reactive/dispatcher.py)
        return result

    def finish(replies: list[Any]) -> Any:
        log_groups_not_made(state.settings, names, replies)
        return result

    return Plan(group_commands(state, names), finish)


def group_commands(state: RedisState, names: Sequence[str]) -> list[list[Any]]:
    """The services named in the set of trigger targets (reactive/targets.py removes the
    stream of one no trigger names, once nobody needs it), then XGROUP CREATE (at `0`,
    MKSTREAM) of each service's group on every shard's stream (a worker with
    STATEWORKER_BUS_SHARDS > 1 reads them all), in the order of `names`, then of the shards."""
    settings = state.settings
    return [["SADD", state.keys.dispatch_targets, *names]] + [
        ["XGROUP", "CREATE", bus_shard_stream(settings.prefix, name, n), name, "0", "MKSTREAM"]
        for name in names for n in range(settings.bus_shards)]


def log_groups_not_made(settings: Settings, names: Sequence[str], replies: list[Any]) -> None:
    """`group_commands`' replies: each group that could not be made (the name holds another
    type, NOPERM ...) logged; BUSYGROUP is a group already there. (A set of targets that
    could not be written leaves that stream for good: it is logged too.)"""
    if isinstance(replies[0], ReplyError):
        log.warning("trigger targets %s: not recorded for removal: %s", ", ".join(names),
                    replies[0], extra={"event": "triggers.target_not_recorded"})
    targets = [name for name in names for _ in range(settings.bus_shards)]
    for name, reply in zip(targets, replies[1:], strict=True):
        if isinstance(reply, ReplyError) and not str(reply).startswith("BUSYGROUP"):
            log.warning("trigger target %s: no consumer group made: %s", name, reply,
                        extra={"event": "triggers.group_failed", "service": name})


def target_services(triggers: Iterable[Trigger]) -> list[str]:
    """The services the triggers call (handlers and bus conditions), the state's left out."""
    return sorted({name for t in triggers for name in (t.service, t.config.condition_service)
                   if name and name != STATE_SERVICE})


def decode_trigger(raw: bytes) -> Trigger:
    return _decoder.decode(raw)


def list_plan(state: RedisState, ctx: CallContext) -> Plan:
    """Every trigger; in `acl` mode a principal's own (an admin's: all), since a registration
    shows its filters' values and its barrier's id."""
    everyone = guard.may_administer(state, ctx)

    def finish(replies: list[Any]) -> TriggersResult:
        flat = command_reply(replies[0], "reading the triggers")
        now = now_ms()
        triggers = [t for t in map(decode_trigger, flat[1::2])
                    if (everyone or t.owner == ctx.principal) and live(t, now)]
        return TriggersResult(sorted(triggers, key=lambda t: t.id.encode()))

    return state.registry_read_plan([["HGETALL", state.keys.triggers]], finish)


def state_register_trigger(state: RedisState, req: RegisterTriggerRequest,
                           ctx: CallContext) -> Plan:
    return register_plan(state, req, ctx)


def state_unregister_trigger(state: RedisState, req: TriggerIdRequest, ctx: CallContext) -> Plan:
    return unregister_plan(state, req.id, ctx)


def state_list_triggers(state: RedisState, req: EmptyRequest, ctx: CallContext) -> Plan:
    return list_plan(state, ctx)

