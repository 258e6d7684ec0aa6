"""`state::set-many` and `state::delete-many`: many entries of one scope in one script call,
each on its own (one failing entry does not stop the others).

They run transaction.lua without a transaction id (each op on its own: its header): the same
checks, encoding and writes as a transaction's `set` and `delete` ops, so the two cannot
drift apart. A request that is malformed (a shape, a key or value over its limit, one key
twice) is refused whole before anything is written; what depends on the stored state (a stale
`expected_version`, the scope's `max_keys`) fails only its entry, named in `errors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stateworker.context import CallContext
from stateworker.errors import InvalidRequest, shown
from stateworker.schemas import (
    BulkError,
    BulkOutcome,
    BulkResult,
    DeleteManyRequest,
    SetManyRequest,
    TxDelete,
    TxSet,
)
from stateworker.scripts.bindings import TRANSACTION
from stateworker.scripts.statuses import STATUS_ERRORS, STATUS_TEXTS, Target
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv.transactions import Encoded, encode_items, script_args
from stateworker.transport.plans import Plan

MAX_BULK_ENTRIES = 1000  # entries per set-many / delete-many call
_FAILED_WIDTH = 4  # index, status, 2 values per failed entry (transaction.lua)


def state_set_many(state: RedisState, req: SetManyRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    ops: list[TxSet | TxDelete] = [TxSet(key=e.key, value=e.value, topic=e.topic, ttl_ms=e.ttl_ms,
                 expected_version=e.expected_version) for e in req.entries]
    return _bulk_plan(state, req.scope, ops, req.max_keys, ctx)


def state_delete_many(state: RedisState, req: DeleteManyRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    ops: list[TxSet | TxDelete] = [TxDelete(key=e.key, expected_version=e.expected_version)
                                   for e in req.entries]
    return _bulk_plan(state, req.scope, ops, None, ctx)


def _bulk_plan(state: RedisState, scope: str, ops: Sequence[TxSet | TxDelete],
               max_keys: int | None, ctx: CallContext) -> Plan:
    if not ops:
        raise InvalidRequest("$.entries: at least one entry", {"path": "$.entries", "limit": 1})
    encoded = encode_items(state, ops, "entries", MAX_BULK_ENTRIES, "per call")
    args = script_args(state, scope, "", max_keys, [(0, Encoded()), (len(ops), encoded),
                                                    (0, Encoded())])

    def finish(reply: list[Any]) -> BulkResult:
        return _result(state, scope, ops, encoded, reply, ctx)

    return state.entry_plan(TRANSACTION, state.target(scope, ops[0].key, ctx), args, finish)


def _result(state: RedisState, scope: str, ops: Sequence[TxSet | TxDelete], encoded: Encoded,
            reply: list[Any], ctx: CallContext) -> BulkResult:
    failed = reply[-1] or []
    errors: list[BulkError] = []
    failures: dict[int, BulkError] = {}
    for at in range(0, len(failed), _FAILED_WIDTH):
        index, status = failed[at], failed[at + 1]
        op = ops[index]
        target = Target(state.settings, scope, op.key, ctx, op.expected_version,
                        isinstance(op, TxSet) and op.expected_version == 0)
        message, details = STATUS_TEXTS[status](target, [status, *failed[at + 2:at + 4]])
        path = f"$.entries[{index}]"
        error = BulkError(index=index, key=op.key, code=STATUS_ERRORS[status].code,
                          message=f"{path} (key {shown(op.key)}): {message}",
                          details={**details, "path": path})
        errors.append(error)
        failures[index] = error
    results: list[BulkOutcome] = []
    for index, op in enumerate(ops):
        if index in failures:
            results.append(BulkOutcome(key=op.key, ok=False, code=failures[index].code))
            continue
        old, _, version, created = reply[4 + 4 * index: 8 + 4 * index]
        if isinstance(op, TxDelete):
            results.append(BulkOutcome(key=op.key, ok=True, deleted=old is not None))
        else:
            results.append(BulkOutcome(key=op.key, ok=True, version=version,
                                       created=created == 1, hash=encoded.values[index].hash))
    return BulkResult(results=results, errors=errors)


