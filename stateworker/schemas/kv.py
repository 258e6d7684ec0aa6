"""The shapes of the functions of one key (get, set, delete, compare-and-set, get-entry, diff,
update, update-topic) and of one scope's plain listings and deletions (list, list-keys,
list-groups, list-namespaces, delete-by-topic).
"""

from __future__ import annotations

from msgspec import UNSET, Raw, Struct, UnsetType

from stateworker.schemas.base import Address, Op, Request, Scoped


# ---- requests ----------------------------------------------------------------------------------
class GetRequest(Address):
    pass


class SetRequest(Address, kw_only=True):
    value: Raw | UnsetType = UNSET
    data: Raw | UnsetType = UNSET  # iii's older name for value
    topic: str | None = None
    ttl_ms: int | None = None
    expected_version: int | None = None
    create_only: bool = False
    max_keys: int | None = None  # the scope's ceiling of live keys, for a new key


class DeleteRequest(Address, kw_only=True):
    expected_version: int | None = None  # delete only the entry at this version (1 or more)


class ScopeRequest(Scoped):
    scope: str


class EmptyRequest(Request):
    pass


class CompareAndSetRequest(Address, kw_only=True):
    value: Raw | UnsetType = UNSET
    expected: Raw | UnsetType = UNSET
    max_keys: int | None = None


class GetEntryRequest(Address, kw_only=True):
    default: Raw | UnsetType = UNSET
    required: bool = False


class DiffRequest(Address, kw_only=True):
    value: Raw
    update: bool = True
    expected_version: int | None = None
    max_keys: int | None = None


class UpdateTopicRequest(Address):
    topic: str | None


class DeleteByTopicRequest(Scoped):
    scope: str
    topic_pattern: str


class ListNamespacesRequest(Request, kw_only=True):
    pattern: str | None = None
    limit: int = 100


class UpdateRequest(Address, kw_only=True):
    ops: list[Op]
    ttl_ms: int | None = None
    expected_version: int | None = None
    topic: str | UnsetType | None = UNSET  # absent: keep; null: clear
    max_keys: int | None = None  # the scope's ceiling of live keys, for a new key


# ---- results -----------------------------------------------------------------------------------
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


class KeysResult(Struct):
    keys: list[str]


class GroupsResult(Struct):
    groups: list[str]


class NamespacesResult(Struct):
    namespaces: list[str]


class OpError(Struct):
    op_index: int
    code: str
    message: str
    doc_url: str = ""  # the code's section of docs/errors.md (error_codes.doc_url)


class UpdateResult(Struct, omit_defaults=True):
    old_value: Raw
    new_value: Raw
    version: int
    errors: list[OpError] | UnsetType = UNSET
