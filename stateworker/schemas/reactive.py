"""The shapes of what reacts to changes: triggers (register, keep, unregister, list; a stored
registration, `Trigger`) and barriers (an arrival, its condition, the decision).
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

from stateworker.schemas.base import NULL, Request


# ---- triggers ----------------------------------------------------------------------------------
class MatchRule(Request):
    """A trigger condition that needs no round trip: the JSON at `pointer` (RFC 6901) in the
    event document equals `equals` (deep JSON equality, as compare-and-set)."""

    pointer: str
    equals: Raw


class TriggerConfig(Request, kw_only=True, omit_defaults=True):
    """What a trigger fires on; every filter given must hold."""

    scope: str | None = None
    key: str | None = None
    key_prefix: str | None = None
    event_types: list[str] | None = None  # created / updated / deleted (or state:created ...)
    match: list[MatchRule] | None = None
    condition_function_id: str | None = None
    condition_config: Raw | UnsetType = UNSET
    condition_service: str | None = None  # where a bus condition runs (default: `service`)
    condition_timeout_ms: int | None = None


class RegisterTriggerRequest(Request, kw_only=True):
    function_id: str
    service: str
    id: str | None = None
    config: TriggerConfig = msgspec.field(default_factory=TriggerConfig)
    ttl_ms: int | None = None  # a lease: gone this long after registering unless kept


class KeepTriggerRequest(Request, kw_only=True):
    id: str
    ttl_ms: int | None = None  # this renewal's lifetime (default: the registration's ttl_ms)


class TriggerIdRequest(Request):
    id: str


class Trigger(Struct, kw_only=True, omit_defaults=True):
    """A stored registration, as `list-triggers` returns it."""

    id: str
    function_id: str
    service: str
    config: TriggerConfig
    created_at: str
    # Where it starts: per partition it covers (its scope's, or every one), the last revision
    # of that partition's stream at registration; it sees only events after them. (None: one
    # stored before starts were recorded, which sees whatever the dispatcher reads.)
    start_revisions: dict[int, str] | None = None
    owner: str | None = None  # `acl` mode: the principal that registered it
    ttl_ms: int | None = None  # a leased trigger: its lifetime, renewed by keep-trigger
    expires_at: str | None = None  # ... and when it is gone unless kept (RFC 3339, ms)


class TriggerIdResult(Struct):
    id: str


class KeptResult(Struct):
    id: str
    expires_at: str


class UnregisteredResult(Struct):
    id: str
    removed: bool


class TriggersResult(Struct):
    triggers: list[Trigger]


# ---- barriers ----------------------------------------------------------------------------------
class BarrierRequest(Request, kw_only=True):
    event: Raw = NULL  # (a missing event has no arrival key: refused as one)
    condition_config: Raw = NULL  # missing or null: refused by barrier.parse_condition


class DeleteBarrierRequest(Request, kw_only=True):
    id: str


class BarrierConfigShape(Request, kw_only=True):
    """`condition_config` as sent; barrier.parse_condition checks it into a BarrierCondition."""

    id: str
    expect: int | list[str]
    key_from: str = "/key"
    carry: str | None = None


class BarrierDeletedResult(Struct):
    deleted: bool  # false: there was no such barrier (never made, deleted, or expired)


class BarrierDecision(Struct, kw_only=True, omit_defaults=True):
    """state::barrier's answer: `allow` (with the payload) once, else `skip`."""

    decision: str
    payload: Raw | UnsetType = UNSET
    reason: str
