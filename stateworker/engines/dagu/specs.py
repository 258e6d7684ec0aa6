"""Dagu's five state actions as function specs (stateworker/specs.py): names, request and
result shapes, reads, doc lines."""

from __future__ import annotations

from typing import Any

from stateworker.engines.dagu import schemas as dagu
from stateworker.specs import Spec

_REFUSED = ("INVALID_REQUEST", "INVALID_CONTEXT", "KEY_TOO_LONG", "RESERVED_SCOPE")


def _action(name: str, result: Any, doc: str, *, read_only: bool = False,
            raises: tuple[str, ...] = _REFUSED) -> Spec:
    return Spec(f"state.{name}", name, dagu.DaguRequest, result, doc, read_only=read_only,
                engine="dagu", raises=raises)


GET = _action("get", dagu.GetOutput, "a key's value, version and hash in a Dagu scope "
              "(`default`, `required`)", read_only=True, raises=(*_REFUSED, "NOT_FOUND"))
SET = _action("set", dagu.SetOutput, "write a value, stored in Dagu's normalized form "
              "(`expected_version`, `create_only`)",
              raises=(*_REFUSED, "VALUE_TOO_LARGE", "CONFLICT"))
DELETE = _action("delete", dagu.DeleteOutput, "delete a key (`expected_version`)",
                 raises=(*_REFUSED, "CONFLICT"))
LIST = _action("list", dagu.ListOutput, "a Dagu scope's keys by prefix (`include_values`, "
               "`limit`)", read_only=True)
DIFF = _action("diff", dagu.DiffOutput, "compare a value with the stored one by hash; "
               "write it when it changed (`update`)",
               raises=(*_REFUSED, "VALUE_TOO_LARGE", "CONFLICT"))

SPECS: tuple[Spec, ...] = (GET, SET, DELETE, LIST, DIFF)
