"""What a trigger registration must be, checked at registration (state/reactive/triggers.py):
its limits (the registry's, and one owner's share of it: docs/decisions/0064), its id, filters,
condition, lease and targets. Everything a dispatcher needs to evaluate a trigger is checked
here: a bad filter is refused with the field named, never found later on an event."""

from __future__ import annotations

import jsonpointer
import msgspec

from stateworker import codec
from stateworker.context import CallContext
from stateworker.errors import InvalidRequest, PermissionDenied, ReservedScope, shown
from stateworker.keys import MAX_FUNCTION_BYTES, MAX_SERVICE_BYTES, STATE_SERVICE
from stateworker.schemas.reactive import TriggerConfig
from stateworker.state.core import guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import barrier

MAX_TRIGGERS = 10_000  # registrations kept, at most (each is matched against every event)
MAX_ID_BYTES = 256
MAX_MATCH_RULES = 16
MAX_EQUALS_BYTES = 64 * 1024
MAX_POINTER_BYTES = 1024  # a match rule's pointer
MAX_REGISTRATION_BYTES = 64 * 1024  # a registration's JSON (every replica reloads them all)
# Every registration's JSON together, at most: every replica's dispatcher reloads them all
# (one HGETALL) when it cannot reread only what changed (reactive/trigger_reads.py), the
# snapshot copies them all, and a claim reads them;
# MAX_TRIGGERS of the largest would be 640 MiB, each reload holding Redis ~0.4 s. 16 MiB
# holds MAX_TRIGGERS registrations of 1.6 KiB, and is read in about 10 ms.
MAX_TRIGGERS_BYTES = 16 * 1024 * 1024
# One owner's share of both (`acl` mode: the registering principal's; lua/includes/shares.lua):
# a tenth of the registrations, as a namespace holds a tenth of the claimed scopes, and a
# quarter of the bytes (1,000 registrations of 4 KiB), so no principal with the `triggers`
# grant leaves the others none (docs/decisions/0064).
MAX_OWNER_TRIGGERS = 1_000
MAX_OWNER_TRIGGERS_BYTES = 4 * 1024 * 1024
MAX_CONDITION_TIMEOUT_MS = 60_000
DEFAULT_CONDITION_TIMEOUT_MS = 5_000
MIN_TTL_MS = 500  # a leased trigger lives at least this long (renewals need a round trip)
MAX_TTL_MS = 86_400_000  # ... and at most a day per renewal
BARRIER = "state::barrier"  # the condition that runs in Redis, no bus round trip
EVENT_TYPES = ("state:created", "state:updated", "state:deleted")

def checked_text(field: str, value: str, limit: int = MAX_ID_BYTES) -> None:
    codec.sized_text(field, value, limit)
    if not value:
        raise InvalidRequest(f"$.{field}: must not be empty", {"path": f"$.{field}"})


def _event_types(values: list[str]) -> list[str]:
    if not values:
        raise InvalidRequest("$.config.event_types: must name at least one of created, "
                             "updated, deleted", {"path": "$.config.event_types"})
    types = []
    for index, value in enumerate(values):
        full = value if value.startswith("state:") else f"state:{value}"
        if full not in EVENT_TYPES:
            raise InvalidRequest(
                f"$.config.event_types[{index}]: {shown(value)} is not an event type; use created, "
                "updated or deleted", {"path": f"$.config.event_types[{index}]"})
        if full not in types:
            types.append(full)
    return types


def _match_rules(config: TriggerConfig) -> None:
    rules = config.match or []
    validate.in_range("config.match", len(rules), 0, MAX_MATCH_RULES, " rules")
    for index, rule in enumerate(rules):
        path = f"$.config.match[{index}]"
        codec.sized_text(f"config.match[{index}].pointer", rule.pointer, MAX_POINTER_BYTES)
        try:
            jsonpointer.JsonPointer(rule.pointer)
        except jsonpointer.JsonPointerException as exc:
            raise InvalidRequest(f"{path}.pointer: {shown(rule.pointer)} is not a JSON pointer "
                                 f"(RFC 6901: empty, or '/' then tokens): {exc}",
                                 {"path": f"{path}.pointer"}) from exc
        codec.value_from_json(bytes(rule.equals), f"config.match[{index}].equals",
                              MAX_EQUALS_BYTES)


def _condition(state: RedisState, config: TriggerConfig, service: str) -> TriggerConfig:
    function_id = config.condition_function_id
    if function_id is None:
        if config.condition_config is not msgspec.UNSET or config.condition_service:
            raise InvalidRequest("$.config.condition_function_id: condition_config and "
                                 "condition_service need a condition function",
                                 {"path": "$.config.condition_function_id"})
        return config
    if function_id != BARRIER:
        validate.bus_target("config.condition_function_id", function_id, MAX_FUNCTION_BYTES)
    timeout = config.condition_timeout_ms
    if timeout is None:
        timeout = DEFAULT_CONDITION_TIMEOUT_MS
    validate.in_range("config.condition_timeout_ms", timeout, 1, MAX_CONDITION_TIMEOUT_MS, " ms")
    if function_id == BARRIER:
        if config.condition_config is msgspec.UNSET:
            raise InvalidRequest("$.config.condition_config: the state::barrier condition needs "
                                 "a condition_config {id, expect, key_from?, carry?}",
                                 {"path": "$.config.condition_config"})
        barrier.parse_condition(state.settings, config.condition_config,
                                "$.config.condition_config")
        return msgspec.structs.replace(config, condition_timeout_ms=timeout)
    condition_service = config.condition_service or service
    validate.bus_target("config.condition_service", condition_service, MAX_SERVICE_BYTES)
    return msgspec.structs.replace(config, condition_service=condition_service,
                                   condition_timeout_ms=timeout)


def checked_config(state: RedisState, config: TriggerConfig, service: str) -> TriggerConfig:
    """The config as stored: filters checked, event types spelled `state:*`, defaults filled."""
    if config.scope is not None:
        validate.name(state.settings, "config.scope", config.scope)
        if config.scope in validate.RESERVED_SCOPES:
            raise ReservedScope(f"config.scope {shown(config.scope)} is reserved for the service's "
                                "own bookkeeping; triggers never see its events",
                                {"path": "$.config.scope", "scope": config.scope})
        owner = state.claims.owner(config.scope)
        if owner is not None:
            raise ReservedScope(f"config.scope {shown(config.scope)} is claimed by namespace "
                                f"{shown(owner)}; triggers never see a private scope's events",
                                {"path": "$.config.scope", "scope": config.scope})
    if config.key is not None:
        validate.name(state.settings, "config.key", config.key)
    if config.key_prefix is not None:
        validate.name(state.settings, "config.key_prefix", config.key_prefix)
    if config.event_types is not None:
        config = msgspec.structs.replace(config, event_types=_event_types(config.event_types))
    _match_rules(config)
    return _condition(state, config, service)


def may_target(state: RedisState, ctx: CallContext, field: str, service: str) -> None:
    if state.settings.auth == "acl" and service == STATE_SERVICE:
        # (its handler calls would come on the shared stream, which acl mode closes: they
        # carry no principal)
        raise InvalidRequest(
            f"$.{field}: in acl mode a trigger cannot call the state service's own functions "
            "(its calls would name no principal); call them from the handler service",
            {"path": f"$.{field}", "service": service})
    if not guard.may_call_service(state, ctx, service):
        raise PermissionDenied(
            f"$.{field}: principal {shown(ctx.principal)} may not call service {shown(service)}, so it "
            "may not register a trigger that calls it",
            {"path": f"$.{field}", "principal": ctx.principal, "fn": "state::register-trigger",
             "service": service, "missing": f"a grant to call {shown(service)}"})


def checked_id(trigger_id: str) -> None:
    checked_text("id", trigger_id)


def checked_ttl(ttl_ms: int | None) -> int | None:
    """A lease's `ttl_ms`: None (no lease), or ms within MIN_TTL_MS..MAX_TTL_MS."""
    if ttl_ms is not None:
        validate.in_range("ttl_ms", ttl_ms, MIN_TTL_MS, MAX_TTL_MS, " ms")
    return ttl_ms
