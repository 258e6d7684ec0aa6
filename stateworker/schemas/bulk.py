"""The shapes of the functions over several keys of a scope in one call: get-many,
delete-by-prefix, set-many, delete-many and transaction.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Raw, Struct, UnsetType

from stateworker.schemas.base import EntryResult, Op, Request, Scoped


# ---- state::get-many, state::delete-by-prefix --------------------------------------------------
class GetManyRequest(Scoped):
    scope: str
    keys: list[str]  # at most bulkread.MAX_GET_MANY keys, each once; values <= max_call_bytes


class DeleteByPrefixRequest(Scoped, kw_only=True):
    scope: str
    prefix: str  # a raw byte prefix of keys; not empty
    limit: int = 1000  # entries deleted at most in this call (bulkread.DEFAULT_DELETE_LIMIT)


class GetManyResult(Struct):
    entries: list[EntryResult]  # in the order of the request's keys


class PrefixDeletedResult(Struct):
    deleted: int
    more: bool  # entries with the prefix remain: call again


# ---- state::transaction ------------------------------------------------------------------------
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


# ---- state::set-many, state::delete-many -------------------------------------------------------
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
