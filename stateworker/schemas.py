"""Request and result shapes of the `state::*` functions, as msgspec Structs.

Values stay JSON text (`msgspec.Raw`) from request to Redis to reply, so their digits, key
order and container kinds are never re-interpreted. Every request Struct is a `Request`: a field
it does not know is refused (UNKNOWN_FIELD naming the nearest known field, validate.request),
so a misspelt option (`max_key`, `expected_verison`) is never silently dropped. The fields iii
documents stay accepted (set's `data`, a claim's `_caller_worker_id`), and so does KeeperHub's
`isolation` on every request that addresses a scope (`Scoped`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

NULL = Raw(b"null")


# ---- requests ---------------------------------------------------------------------------------
class Request(Struct, forbid_unknown_fields=True):
    """A request, or a part of one: unknown fields are refused."""


class Scoped(Request, kw_only=True):
    """A request that addresses a scope. `isolation` is KeeperHub's: the catalog's rewrite
    (engines/keeperhub/rules.py) has checked it and set `scope` from the context before the
    body is decoded, and leaves it in the body."""

    isolation: str | UnsetType | None = UNSET


class Address(Scoped):
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
    max_keys: int | None = None  # the scope's ceiling of live keys, for a new key


class DeleteRequest(Address, kw_only=True):
    expected_version: int | None = None  # delete only the entry at this version (1 or more)


class ScopeRequest(Scoped):
    scope: str


class EmptyRequest(Request):
    pass


class UiContentRequest(Request):
    path: str  # a console file, e.g. "state/console.js" (uicontent.py)


class UiContentResult(Struct):
    content: str  # the file, verbatim
    content_type: str


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


class BarrierRequest(Request, kw_only=True):
    event: Raw = NULL  # (a missing event has no arrival key: refused as one)
    condition_config: Raw = NULL  # missing or null: refused by barrier.parse_condition


class DeleteBarrierRequest(Request, kw_only=True):
    id: str


class BarrierDeletedResult(Struct):
    deleted: bool  # false: there was no such barrier (never made, deleted, or expired)


class BarrierConfigShape(Request, kw_only=True):
    """`condition_config` as sent; barrier.parse_condition checks it into a BarrierCondition."""

    id: str
    expect: int | list[str]
    key_from: str = "/key"
    carry: str | None = None


class ClaimNamespaceRequest(Request):
    # Any: a wrong type is INVALID_PREFIX / INVALID_SCOPE (validate.py), not INVALID_REQUEST.
    # The claimant is the call's `caller`, never a body field (iii's `_caller_worker_id` is
    # accepted and ignored: a body is whatever the caller writes).
    functions_prefix: Any
    scopes: list[Any]
    # An admin takes public scopes in use (entries, a trigger, a recent write) on purpose:
    # logged, and named in the registry entry. Without it such a scope is SCOPE_IN_USE.
    adopt: bool = False
    caller_worker_id: Any = msgspec.field(default=UNSET, name="_caller_worker_id")


class ReleaseNamespaceRequest(Request, kw_only=True):
    # Any: a wrong type is INVALID_SCOPE (validate.py), as for claim-namespace. The releaser
    # is the call's `caller` (`acl`: its principal), which must own every scope, unless an
    # admin says `force` (iii's `_caller_worker_id`: accepted and ignored, as for a claim).
    scopes: list[Any]
    force: bool = False
    caller_worker_id: Any = msgspec.field(default=UNSET, name="_caller_worker_id")


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


class GetManyRequest(Scoped):
    scope: str
    keys: list[str]  # at most bulkread.MAX_GET_MANY keys; one may come twice


class DeleteByPrefixRequest(Scoped, kw_only=True):
    scope: str
    prefix: str  # a raw byte prefix of keys; not empty
    limit: int = 1000  # entries deleted at most in this call (bulkread.DEFAULT_DELETE_LIMIT)

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


class UpdatedResult(Struct):
    updated: bool


class DeletedResult(Struct):
    deleted: int


class ClaimResult(Struct, omit_defaults=True):
    claimed: bool  # false when the namespace already owned every scope asked for
    scopes: list[str]  # every scope the namespace owns, byte-sorted
    functions: list[str]  # its accessors
    adopted: list[str] | UnsetType = UNSET  # the scopes in use an admin adopted (`adopt`)


class ReleaseResult(Struct):
    released: list[str]  # the scopes made public again, byte-sorted
    scopes: list[str]  # every scope the caller's namespace still owns, byte-sorted


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


class GetManyResult(Struct):
    entries: list[EntryResult]  # in the order of the request's keys


class PrefixDeletedResult(Struct):
    deleted: int
    more: bool  # entries with the prefix remain: call again

# One reused encoder; Raw fields are written through as they are.
encoder = msgspec.json.Encoder()


# ---- state::update -----------------------------------------------------------------------------
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
NestedPath = str | list[str] | None


class SetOp(Request, tag="set", tag_field="type"):
    path: str
    value: Raw | UnsetType = UNSET  # missing means null


class RemoveOp(Request, tag="remove", tag_field="type"):
    path: str


class IncrementOp(Request, tag="increment", tag_field="type"):
    path: str
    by: Int64


class DecrementOp(Request, tag="decrement", tag_field="type"):
    path: str
    by: Int64


class MergeOp(Request, tag="merge", tag_field="type"):
    value: Raw
    path: NestedPath = None


class AppendOp(Request, tag="append", tag_field="type"):
    value: Raw
    path: NestedPath = None


Op = SetOp | RemoveOp | IncrementOp | DecrementOp | MergeOp | AppendOp


class UpdateRequest(Address, kw_only=True):
    ops: list[Op]
    ttl_ms: int | None = None
    expected_version: int | None = None
    topic: str | UnsetType | None = UNSET  # absent: keep; null: clear
    max_keys: int | None = None  # the scope's ceiling of live keys, for a new key


class OpError(Struct):
    op_index: int
    code: str
    message: str
    doc_url: str = ""  # the code's section of docs/errors.md (errors.doc_url)


class UpdateResult(Struct, omit_defaults=True):
    old_value: Raw
    new_value: Raw
    version: int
    errors: list[OpError] | UnsetType = UNSET


# ---- state::list-entries --------------------------------------------------------------------------
class ListEntriesRequest(Scoped, kw_only=True):
    scope: str
    prefix: str | None = None
    key_pattern: str | None = None
    topic_pattern: str | None = None
    order_by: Literal["key", "updated_at", "topic"] = "key"
    order: Literal["asc", "desc"] = "asc"
    limit: int = 100
    offset: int = 0
    after: str | None = None
    include_values: bool = False


class ListedEntry(Struct, omit_defaults=True):
    key: str
    topic: str | None
    version: int
    hash: str
    created_at: str | None
    updated_at: str | None
    expires_at: str | None
    updated_by: str | None
    value: Raw | UnsetType = UNSET


class ListEntriesResult(Struct, omit_defaults=True):
    entries: list[ListedEntry]
    next_after: str | UnsetType = UNSET


# ---- state::transaction -----------------------------------------------------------------------
class CheckFields(Request, kw_only=True):
    """A precondition that writes nothing; every field given must hold."""

    key: str
    expected_version: int | None = None  # 0: the key must be absent
    expected_hash: str | None = None  # the stored value's hash (`hash` of get-entry)
    exists: bool | None = None
    absent: bool | None = None


class TxCheck(CheckFields, tag="check", tag_field="op"):
    pass


class TxSet(Request, tag="set", tag_field="op", kw_only=True):
    key: str
    value: Raw
    topic: str | None = None
    ttl_ms: int | None = None
    expected_version: int | None = None
    create_only: bool = False


class TxUpdate(Request, tag="update", tag_field="op", kw_only=True):
    key: str
    ops: list[Op]
    ttl_ms: int | None = None
    expected_version: int | None = None
    topic: str | UnsetType | None = UNSET  # absent: keep; null: clear


class TxDelete(Request, tag="delete", tag_field="op", kw_only=True):
    key: str
    expected_version: int | None = None


class TxCompareAndSet(Request, tag="compare-and-set", tag_field="op", kw_only=True):
    key: str
    value: Raw
    expected: Raw | UnsetType = UNSET  # absent or null: the key must be absent


TxOp = TxSet | TxUpdate | TxDelete | TxCompareAndSet | TxCheck


class TransactionRequest(Scoped, kw_only=True):
    scope: str
    ops: list[TxOp]
    compare: list[CheckFields] | None = None  # all hold: `ops` run, else `else_ops`
    else_ops: list[TxOp] | None = None
    max_keys: int | None = None  # the scope's ceiling of live keys, for the keys created


class TxOpResult(Struct, kw_only=True, omit_defaults=True):
    """One op's outcome: `version` is the entry's after the transaction (0: absent)."""

    op: str
    key: str
    version: int
    old_value: Raw | UnsetType = UNSET  # set, update, delete, compare-and-set: null if absent
    new_value: Raw | UnsetType = UNSET  # set, update, compare-and-set
    hash: str | UnsetType = UNSET  # set, compare-and-set
    created: bool | UnsetType = UNSET  # set, update, compare-and-set
    deleted: bool | UnsetType = UNSET  # delete


class TransactionResult(Struct, kw_only=True):
    branch: Literal["ops", "else_ops"]  # which list ran (`compare` held: ops)
    results: list[TxOpResult]  # one per op of that list, in order
    revision: str | None  # the revision of the transaction's last event (null: no change)
    tx: str  # the id its events carry


# ---- state::set-many, state::delete-many ---------------------------------------------------------
class SetManyEntry(Request, kw_only=True):
    key: str
    value: Raw
    expected_version: int | None = None  # 0: the key must be absent
    topic: str | None = None
    ttl_ms: int | None = None


class DeleteManyEntry(Request, kw_only=True):
    key: str
    expected_version: int | None = None


class SetManyRequest(Scoped, kw_only=True):
    scope: str
    entries: list[SetManyEntry]
    max_keys: int | None = None  # the scope's ceiling of live keys, for the keys created


class DeleteManyRequest(Scoped, kw_only=True):
    scope: str
    entries: list[DeleteManyEntry]


class BulkOutcome(Struct, kw_only=True, omit_defaults=True):
    """One entry's outcome: `ok`, and what the single call would have said, or its `code`."""

    key: str
    ok: bool
    version: int | UnsetType = UNSET  # set-many: the new version
    created: bool | UnsetType = UNSET  # set-many
    hash: str | UnsetType = UNSET  # set-many
    deleted: bool | UnsetType = UNSET  # delete-many: false when the key was absent
    code: str | UnsetType = UNSET  # a failed entry's error code


class BulkError(Struct, kw_only=True):
    index: int
    key: str
    code: str
    message: str
    details: dict[str, Any]


class BulkResult(Struct, kw_only=True):
    results: list[BulkOutcome]  # one per entry, in request order
    errors: list[BulkError]  # the failed entries


# ---- state::query and its indexes ------------------------------------------------------------------
class WhereItem(Request):
    pointer: str  # RFC 6901: "" the whole value, "/a/0" ...
    op: str  # eq ne lt lte gt gte in exists prefix (checked by state/query/predicates.py)
    value: Raw | UnsetType = UNSET


class QueryRequest(Scoped, kw_only=True):
    scope: str
    where: list[WhereItem]
    order_by: Literal["key", "updated_at"] = "key"
    limit: int = 100
    after: str | None = None


class QueryResult(Struct, omit_defaults=True):
    entries: list[ListedEntry]  # as list-entries gives them, with values
    next_after: str | UnsetType = UNSET
    index: str | UnsetType = UNSET  # the pointer whose index the page walked (none: the keys)


class IndexRequest(Scoped):
    scope: str
    pointer: str


class ScopeIndexesRequest(Scoped):
    scope: str


class CreateIndexResult(Struct):
    created: bool  # false: the index was defined already
    building: bool  # true: its build has not finished (create it again to resume)


class DropIndexResult(Struct):
    dropped: bool


class IndexInfo(Struct):
    pointer: str
    state: str  # building | ready
    indexed: int  # the scope's keys the build has walked (all of them once ready)
    total: int  # the scope's keys


class IndexesResult(Struct):
    indexes: list[IndexInfo]


# ==== iii's paged listing and live settings (issue 41) =========================================
# One block, so it moves as one when this module is split.
class EntriesPageRequest(Scoped, kw_only=True):
    """state::list_entries, as iii serves it: the first call (no cursor) captures the scope."""

    scope: str
    cursor: str | None = None
    limit: int = 100
    max_bytes: int = 1_000_000


class EntriesPage(Struct):
    """One page of a snapshot: each entry a row `[key, value]` (JSON as stored), in key byte
    order; `next_cursor` null once `done`; `offset`: the snapshot's entries before this page,
    `total`: all of them."""

    entries: list[Raw]
    done: bool
    next_cursor: str | None
    offset: int
    total: int


class ConfigChangeRequest(Request, kw_only=True):
    """state::on-config-change: iii's takes `{}` (a reload); the live settings given are stored
    first, null removing an override (the setting's value at start comes back)."""

    max_value_bytes: int | UnsetType | None = UNSET
    triggers_enabled: bool | UnsetType | None = UNSET


class ConfigChangeResult(Struct):
    ok: bool
    max_value_bytes: int  # the settings now in force on the replica that served the call
    triggers_enabled: bool
