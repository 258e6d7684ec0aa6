"""The shapes of the reads of a scope's entries in pages: list-entries (by key, update time or
topic) and query (by the JSON in their values), and of the indexes a query walks.
"""

from __future__ import annotations

from typing import Literal

from msgspec import UNSET, Raw, Struct, UnsetType

from stateworker.schemas.base import ListedEntry, Request, Scoped


# ---- state::list-entries -----------------------------------------------------------------------
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


class ListEntriesResult(Struct, omit_defaults=True):
    entries: list[ListedEntry]
    next_after: str | UnsetType = UNSET


# ---- state::query and its indexes --------------------------------------------------------------
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


# ---- state::list_entries (iii's snapshot pages) -------------------------------------------------
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
