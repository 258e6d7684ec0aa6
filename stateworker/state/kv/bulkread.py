"""Bulk reads and prefix deletes: state::get-many and state::delete-by-prefix.

`get-many` reads every key asked in one read-only script (getmany.lua), each entry as
`get-entry` gives it: a key asked twice is read twice, and the values read, each time, are at
most `max_call_bytes` in all (more: CALL_TOO_LARGE, nothing returned: a small call asking one
large value again and again builds no large reply); the hashes an update left unknown are
computed here and stored in one second step (as list-entries does). `delete-by-prefix`
deletes at most `limit` entries in key order per call, from the scope's key index
(delprefix.lua: one atomic, bounded batch); `more` tells the caller to call again.
"""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker import clock
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.errors import CallTooLarge, InvalidRequest
from stateworker.schemas import (
    DeleteByPrefixRequest,
    EntryResult,
    GetManyRequest,
    GetManyResult,
    PrefixDeletedResult,
)
from stateworker.scripts.bindings import DELPREFIX, delprefix_args
from stateworker.scripts.read_bindings import GETMANY, getmany_call
from stateworker.scripts.replies import DelprefixReply, GetManyReply
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv.reads import hash_plan
from stateworker.transport.plans import Plan

MAX_GET_MANY = 1000  # keys one get-many reads at most
DEFAULT_DELETE_LIMIT = 1000  # entries one delete-by-prefix deletes at most, by default
MAX_DELETE_LIMIT = 10_000  # ... and the highest `limit` it takes
# Entries one delete-by-prefix script deletes at most, whatever its `limit`: the batch is one
# script (its deletes recorded with the call's reply), and Redis serves no one else while it
# runs: 10,000 deletes (an event and the indexes each) took ~180 ms, 1,000 take ~18. A call
# whose `limit` is more deletes this many and answers `more` (its contract: "at most").
DELETE_BATCH = 1000


def state_get_many(state: RedisState, req: GetManyRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    if len(req.keys) > MAX_GET_MANY:
        raise InvalidRequest(f"$.keys: at most {MAX_GET_MANY} keys, got {len(req.keys)}",
                             {"path": "$.keys", "size": len(req.keys), "limit": MAX_GET_MANY})
    for i, key in enumerate(req.keys):
        validate.name(state.settings, f"keys[{i}]", key)
    return get_many_plan(state, req.scope, req.keys)


def state_delete_by_prefix(state: RedisState, req: DeleteByPrefixRequest,
                           ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    validate.pattern("prefix", req.prefix)
    if req.prefix == "":
        raise InvalidRequest("$.prefix: must not be empty (an empty prefix would match every "
                             "key of the scope)", {"path": "$.prefix"})
    validate.in_range("limit", req.limit, 1, MAX_DELETE_LIMIT)
    return delete_by_prefix_plan(state, req.scope, req.prefix, req.limit, ctx)


def _ms(raw: bytes | int | None) -> str | None:
    return None if raw is None else clock.rfc3339_ms(int(raw))


def _entry(f: list[Any]) -> EntryResult:
    """One key's fields (getmany.lua) as get-entry's result; the hash "" when unknown."""
    v, n, h, t, c, u, x, b, r = f
    if v is None:
        return EntryResult(False)
    return EntryResult(True, msgspec.Raw(v), int(n), "" if h is None else h.hex(),
                       None if t is None else t.decode(), _ms(c or b"0") or "",
                       _ms(u or b"0") or "", _ms(x), None if b is None else b.decode(),
                       (r or b"").decode())


def keys_too_large(index: int, size: int, limit: int) -> CallTooLarge:
    """The refusal of a read of many keys whose values, each reading counted up to key
    `index`, came to `size` bytes, over `limit` (get-many's, and Dapr's bulk get's)."""
    return CallTooLarge(
        f"$.keys[{index}]: the values of keys up to this one are {size} bytes, more than the "
        f"limit of {limit} bytes of values one call reads (max_call_bytes, "
        "STATEWORKER_MAX_CALL_BYTES); nothing was returned: ask fewer keys a call",
        {"path": f"$.keys[{index}]", "size": size, "limit": limit})


def get_many_plan(state: RedisState, scope: str, keys: list[str]) -> Plan:
    """The entries of `keys`, in that order, in one script call (and one step storing the
    hashes an update left unknown, when there are any)."""
    budget = state.settings.max_call_bytes

    def finish(reply: GetManyReply) -> Any:
        if reply.over is not None:
            raise keys_too_large(*reply.over)
        fields = reply.entries
        entries = [_entry(f) for f in fields]
        unknown = {keys[i]: (entry, fields[i][0])
                   for i, entry in enumerate(entries) if entry.found and not entry.hash}
        if not unknown:
            return GetManyResult(entries)
        steps = [(key, hash_plan(state, scope, key, entry.version, value))  # type: ignore[arg-type]
                 for key, (entry, value) in unknown.items()]
        return _with_hashes(entries, keys, steps)

    return state.script_plan(GETMANY, getmany_call(state.keys.for_scope(scope), scope, keys, budget),
                             finish)


def _with_hashes(entries: list[EntryResult], keys: list[str],
                 steps: list[tuple[str, Plan]]) -> Plan:
    """One step storing every missing hash; then the entries with the hashes filled in."""
    def finish(replies: list[Any]) -> GetManyResult:
        digests: dict[str, str] = {}
        position = 0
        for key, step in steps:
            digests[key] = step.finish(replies[position:position + len(step.commands)])
            position += len(step.commands)
        for key, entry in zip(keys, entries, strict=True):
            if entry.found and not entry.hash:
                entry.hash = digests[key]
        return GetManyResult(entries)

    return Plan([command for _, step in steps for command in step.commands], finish)


def delete_by_prefix_plan(state: RedisState, scope: str, prefix: str, limit: int,
                          ctx: CallContext = NO_CONTEXT) -> Plan:
    """One batch: at most `limit` entries whose key starts with `prefix`, in key order (an
    entry script: a bus call's reply is recorded with the deletes)."""
    def finish(reply: DelprefixReply) -> PrefixDeletedResult:
        return PrefixDeletedResult(reply.deleted, reply.more)

    args = delprefix_args(state.keys.for_scope(scope), scope, prefix.encode(),
                          min(limit, DELETE_BATCH), state.settings.max_call_bytes)
    return state.entry_plan(DELPREFIX, state.target(scope, prefix, ctx), args, finish)
