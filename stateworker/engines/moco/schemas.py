"""moco's State Store Activities: their `input_data` shapes and their results.

Requests are exactly the fields moco documents; any other field is refused (a misspelt
`in_global_ns` must not silently write to a user's private namespace instead of the shared one).
"""

from __future__ import annotations

from typing import Literal

from msgspec import Raw, Struct


# ---- requests (moco's `input_data`) -----------------------------------------------------------
class NamespaceRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    namespace: str
    in_global_ns: bool = False


class KeyRequest(NamespaceRequest, kw_only=True):
    """get_state, get_state_with_ts, del_state."""

    key: str


class SetStateRequest(KeyRequest, kw_only=True):
    value: Raw
    topic: str | None = None  # omitted: the row's earlier topic is cleared (moco's rule)


class UpdateTopicRequest(KeyRequest, kw_only=True):
    topic: str | None = None  # null or omitted: the tag is cleared


class ListStatesRequest(NamespaceRequest, kw_only=True):
    key_pattern: str | None = None
    topic_pattern: str | None = None
    limit: int | None = None  # null: every row
    offset: int | None = None
    order_by: Literal["key", "last_update_time", "topic"] = "key"
    order_direction: Literal["asc", "desc"] = "asc"


class DeleteByTopicRequest(NamespaceRequest, kw_only=True):
    topic_pattern: str


class ListNamespacesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    name_pattern: str | None = None
    limit: int | None = None  # null: every namespace
    in_global_ns: bool = False


# ---- results ----------------------------------------------------------------------------------
class StateWithTs(Struct):
    value: Raw
    last_update_time: str | None


class StateRow(Struct):
    key: str
    topic: str | None
