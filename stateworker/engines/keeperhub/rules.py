"""KeeperHub's isolation from the call's context: a native call with
`"isolation": "workflow"` names no scope; its scope is the workflow's own,
`wf/<context.org_id>/<context.workflow_id>`, taken from the bus entry's `context` and never
from the body. A front-end that always sends it gives each workflow state that no body can
reach out of: another workflow's scope is simply not addressable.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from stateworker.context import CallContext
from stateworker.errors import InvalidContext, InvalidRequest, shown
from stateworker.state.core import validate
from stateworker.state.functions import SCOPED

MARKER = b'"isolation"'  # bodies without it (nearly all) are passed on untouched
MODES = ("workflow",)
SCOPE_PREFIX = "wf/"


def workflow_scope(ctx: CallContext) -> str:
    """`wf/<org_id>/<workflow_id>`; the org id holds no "/", so no two workflows share one."""
    return _scope_of(_context_text(ctx, "org_id"), _context_text(ctx, "workflow_id"))


def _scope_of(org: str, workflow: str) -> str:
    if "/" in org:
        raise InvalidContext(f"context.org_id: must not contain '/' (it ends the org's part "
                             f"of the scope {SCOPE_PREFIX}<org_id>/<workflow_id>), got {shown(org)}",
                             {"path": "context.org_id"})
    return f"{SCOPE_PREFIX}{org}/{workflow}"


def _context_text(ctx: CallContext, name: str) -> str:
    value = ctx.context.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidContext(
            f"context.{name}: an isolated call (isolation: workflow) takes its scope from the "
            f"bus entry's context, which must carry {name} as non-empty text; got {shown(value)}",
            {"path": f"context.{name}"})
    return value


ABSENT = msgspec.Raw(b"")


class _Asked(msgspec.Struct):
    """The two fields isolation reads (the others are the function's: left as they are)."""

    isolation: msgspec.Raw = ABSENT  # (any JSON value, null included; ABSENT: not sent)
    scope: msgspec.Raw = ABSENT


_ASKED = msgspec.json.Decoder(_Asked)
_WORKFLOW = b'"workflow"'  # (the mode as it is nearly always written)


def isolated(fn: str, body: bytes, ctx: CallContext) -> bytes:
    """`body` of the native function `fn` with its scope set from the context when it asks
    for isolation; other bodies as they are (a `Catalog`'s rewrite: engines/catalog.py).
    (The scope is written in front of the body's own fields rather than the body encoded
    again: this runs on every isolated call; `isolation` stays, a field the native
    functions ignore.)"""
    if MARKER not in body:
        return body
    try:
        asked = _ASKED.decode(body)
    except (msgspec.DecodeError, RecursionError):
        asked = validate.request(body, _Asked)  # (raises, saying what is wrong)
    if not asked.isolation:  # (the marker was inside a value)
        return body
    if bytes(asked.isolation) != _WORKFLOW:
        try:
            mode: Any = msgspec.json.decode(asked.isolation)
        except msgspec.DecodeError:  # (1e309: JSON, but no double holds it; refused below)
            mode = ...
        if mode is None:
            return body
        if mode not in MODES:
            raise InvalidRequest(f"$.isolation: must be one of {', '.join(MODES)} (or null), "
                                 f"got {bytes(asked.isolation).decode()[:100]}",
                                 {"path": "$.isolation"})
    if fn not in SCOPED:
        raise InvalidRequest(f"$.isolation: {fn} takes no scope, so it cannot be isolated",
                             {"path": "$.isolation"})
    if asked.scope:
        raise InvalidRequest("$.scope: an isolated call (isolation: workflow) takes its scope "
                             "from its context (org_id, workflow_id); leave scope out",
                             {"path": "$.scope"})
    brace = body.index(b"{") + 1  # (a JSON object, with "isolation" in it: never empty)
    return b"".join((body[:brace], b'"scope":', _scope_json(ctx), b",", body[brace:]))


def _scope_json(ctx: CallContext) -> bytes:
    """The workflow's scope as JSON text; checked and encoded once per workflow (an error is
    raised again each time, never cached)."""
    org, workflow = ctx.context.get("org_id"), ctx.context.get("workflow_id")
    if type(org) is str and type(workflow) is str and org and workflow and \
            len(org) + len(workflow) <= 1024:
        return _scope_text(org, workflow)
    return msgspec.json.encode(workflow_scope(ctx))  # (refused, or too long to keep)


@functools.lru_cache(maxsize=1024)
def _scope_text(org: str, workflow: str) -> bytes:
    return msgspec.json.encode(_scope_of(org, workflow))
