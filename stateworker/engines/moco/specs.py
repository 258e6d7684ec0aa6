"""moco's eight activities as function specs (stateworker/specs.py): names, request and
result shapes, reads, doc lines."""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.engines.moco import schemas as moco
from stateworker.specs import Spec

_REFUSED = ("INVALID_REQUEST", "INVALID_CONTEXT", "ReservedNamespaceError", "KEY_TOO_LONG",
            "RESERVED_SCOPE")


def _activity(name: str, request: type[Any], result: Any, doc: str, *,
              read_only: bool = False, raises: tuple[str, ...] = _REFUSED) -> Spec:
    return Spec(f"builtin.state.{name}", name, request, result, doc, read_only=read_only,
                engine="moco", raises=raises)


SET_STATE = _activity("set_state", moco.SetStateRequest, msgspec.Raw,
                      "write a row (value and topic) of a namespace; null",
                      raises=(*_REFUSED, "VALUE_TOO_LARGE"))
GET_STATE = _activity("get_state", moco.KeyRequest, msgspec.Raw,
                      "a row's value, or null", read_only=True)
GET_STATE_WITH_TS = _activity("get_state_with_ts", moco.KeyRequest, moco.StateWithTs,
                              "a row's value and last update time", read_only=True)
DEL_STATE = _activity("del_state", moco.KeyRequest, msgspec.Raw, "delete a row; null")
LIST_STATES = _activity("list_states", moco.ListStatesRequest, list[moco.StateRow],
                        "a namespace's rows (key, topic) by patterns, ordered and paged",
                        read_only=True)
LIST_NAMESPACES = _activity("list_namespaces", moco.ListNamespacesRequest, list[str],
                            "the caller's (or the global) namespaces, by pattern",
                            read_only=True)
UPDATE_TOPIC = _activity("update_topic", moco.UpdateTopicRequest, msgspec.Raw,
                         "retag a row (null clears); null")
DELETE_BY_TOPIC = _activity("delete_by_topic", moco.DeleteByTopicRequest, int,
                            "delete a namespace's rows whose topic matches; how many")

SPECS: tuple[Spec, ...] = (SET_STATE, GET_STATE, GET_STATE_WITH_TS, DEL_STATE, LIST_STATES,
                           LIST_NAMESPACES, UPDATE_TOPIC, DELETE_BY_TOPIC)
