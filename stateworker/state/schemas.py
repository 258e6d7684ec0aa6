"""Request and result shapes of the `state::*` functions, as msgspec Structs.

Values stay JSON text (`msgspec.Raw`) from request to Redis to reply, so their digits, key
order and container kinds are never re-interpreted. Unknown request fields are ignored.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType

NULL = Raw(b"null")


# ---- requests ---------------------------------------------------------------------------------
class Address(Struct):
    scope: str
    key: str


class GetRequest(Address):
    pass


class SetRequest(Address, kw_only=True):
    value: Raw | UnsetType = UNSET
    data: Raw | UnsetType = UNSET  # iii's older name for value
    topic: str | None = None
    ttl_ms: int | None = None
    expected_version: int | None = None
    create_only: bool = False


class DeleteRequest(Address):
    pass


class ScopeRequest(Struct):
    scope: str


class EmptyRequest(Struct):
    pass


class CompareAndSetRequest(Address, kw_only=True):
    value: Raw | UnsetType = UNSET
    expected: Raw | UnsetType = UNSET


class GetEntryRequest(Address, kw_only=True):
    default: Raw | UnsetType = UNSET
    required: bool = False


class DiffRequest(Address, kw_only=True):
    value: Raw
    update: bool = True
    expected_version: int | None = None


class UpdateTopicRequest(Address):
    topic: str | None


class DeleteByTopicRequest(Struct):
    scope: str
    topic_pattern: str


class ListNamespacesRequest(Struct, kw_only=True):
    pattern: str | None = None
    limit: int = 100


class BarrierRequest(Struct, kw_only=True):
    event: Raw = NULL  # (a missing event has no arrival key: refused as one)
    condition_config: Raw = NULL  # missing or null: refused by barrier.parse_condition


class BarrierConfigShape(Struct, kw_only=True):
    """`condition_config` as sent; barrier.parse_condition checks it into a BarrierCondition."""

    id: str
    expect: int | list[str]
    key_from: str = "/key"
    carry: str | None = None


# ---- results ----------------------------------------------------------------------------------
class SetResult(Struct):
    old_value: Raw
    new_value: Raw
    version: int
    hash: str
    created: bool


class SwapResult(Struct, omit_defaults=True):
    swapped: bool
    current: Raw | UnsetType = UNSET


class DiffResult(Struct, kw_only=True, omit_defaults=True):
    changed: bool
    found_previous: bool
    previous_version: int | UnsetType = UNSET
    previous: Raw | UnsetType = UNSET
    version: int | UnsetType = UNSET
    hash: str | UnsetType = UNSET


class UpdatedResult(Struct):
    updated: bool


class DeletedResult(Struct):
    deleted: int


class NamespacesResult(Struct):
    namespaces: list[str]


class BarrierDecision(Struct, kw_only=True, omit_defaults=True):
    """state::barrier's answer: `allow` (with the payload) once, else `skip`."""

    decision: str
    payload: Raw | UnsetType = UNSET
    reason: str


class KeysResult(Struct):
    keys: list[str]


class GroupsResult(Struct):
    groups: list[str]


class EntryResult(Struct, omit_defaults=True):
    found: bool
    value: Raw | UnsetType = UNSET
    version: int | UnsetType = UNSET
    hash: str | UnsetType = UNSET
    topic: str | UnsetType | None = UNSET
    created_at: str | UnsetType = UNSET
    updated_at: str | UnsetType = UNSET
    expires_at: str | UnsetType | None = UNSET
    updated_by: str | UnsetType | None = UNSET
    revision: str | UnsetType = UNSET


# One reused encoder; Raw fields are written through as they are.
encoder = msgspec.json.Encoder()
