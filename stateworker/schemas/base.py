"""What every request and result of the `state::*` functions stands on, as msgspec Structs,
and the shapes several families share.

Values stay JSON text (`msgspec.Raw`) from request to Redis to reply, so their digits, key
order and container kinds are never re-interpreted. Every request Struct is a `Request`: a field
it does not know is refused (UNKNOWN_FIELD naming the nearest known field, validate.request),
so a misspelt option (`max_key`, `expected_verison`) is never silently dropped. The fields iii
documents stay accepted (set's `data`, a claim's `_caller_worker_id`), and so does KeeperHub's
`isolation` on every request that addresses a scope (`Scoped`).

Shared: an entry as read (`EntryResult`: get-entry, get-many; `ListedEntry`: list-entries,
query) and the ops of an update (`Op`: state::update, a transaction's update).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

NULL = Raw(b"null")
# One reused encoder; Raw fields are written through as they are.
encoder = msgspec.json.Encoder()


# ---- requests ----------------------------------------------------------------------------------
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


# ---- an entry as read --------------------------------------------------------------------------
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


# ---- state::update's ops (a transaction's update too) ------------------------------------------
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
