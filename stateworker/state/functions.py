"""The `state::*` functions as JSON in, JSON out: what the bus and `StateStore.call` run.

Each function takes its decoded request Struct, validates it (a StateError before anything
is sent) and returns the store's Plan for it; the plan's result is a Struct that
`schemas.encoder` writes. Values stay `msgspec.Raw` the whole way. `FUNCTIONS` pairs each
with its request type (`decoded`); the engines' front-ends (`stateworker/engines/`) call the
typed functions themselves, so a translated call is checked and run exactly as a native one.
A `Catalog` is what a service serves: the native functions, or those and the engines'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import msgspec

from stateworker import codec
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import LUA_STATUS, CallIdReused, InvalidRequest, UnknownFunction, deadline_exceeded
from stateworker.state import (
    barrier,
    listing,
    namespaces,
    ops,
    reads,
    triggers,
    validate,
    writes,
)
from stateworker.state.bindings import KEEP, STATUS_TEXTS, Target, UpdateReply
from stateworker.state.schemas import (
    NULL,
    BarrierRequest,
    ClaimNamespaceRequest,
    CompareAndSetRequest,
    DeleteByTopicRequest,
    DeletedResult,
    DeleteRequest,
    DiffRequest,
    EmptyRequest,
    GetEntryRequest,
    GetRequest,
    ListNamespacesRequest,
    NamespacesResult,
    ScopeRequest,
    SetRequest,
    UpdatedResult,
    UpdateTopicRequest,
    encoder,
)
from stateworker.state.store import RedisState
from stateworker.transport.plans import Plan, command_reply, then
from stateworker.transport.wire import Arg

Prepare = Callable[[RedisState, bytes, CallContext], Plan]
Rewrite = Callable[[str, bytes, CallContext], bytes]  # (fn, body, ctx) -> the body to decode
R = TypeVar("R")


def decoded(request_type: type[R], function: Callable[[RedisState, R, CallContext], Plan]
            ) -> Prepare:
    """`function` on a JSON body: the body decoded as `request_type` first (a malformed one
    is INVALID_REQUEST with `details.path`)."""
    def prepare_call(state: RedisState, body: bytes, ctx: CallContext) -> Plan:
        return function(state, validate.request(body, request_type), ctx)

    return prepare_call


def state_get(state: RedisState, req: GetRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    return then(reads.get_plan(state, req.scope, req.key), lambda found: NULL if found is None else found)


def state_set(state: RedisState, req: SetRequest, ctx: CallContext,
              checked: codec.Value | None = None) -> Plan:
    """`checked`: the value as a front-end already checked it (Dagu's normalized form),
    written as it is instead of `req.value`."""
    validate.address(state, ctx, req.scope, req.key)
    if checked is None:
        raw = req.value if req.value is not msgspec.UNSET else req.data
        if raw is msgspec.UNSET:
            raise InvalidRequest("$.value: the field `value` (or `data`) is required",
                                 {"path": "$.value"})
        checked = validate.value(state.settings, raw)
    return writes.set_plan(state,
        req.scope, req.key, checked,
        topic=validate.topic(req.topic), ttl_ms=validate.ttl_ms(req.ttl_ms),
        expected_version=validate.expected_version(req.expected_version),
        create_only=req.create_only, max_keys=validate.max_keys(req.max_keys), ctx=ctx,
    )


def state_delete(state: RedisState, req: DeleteRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    return writes.delete_plan(state, req.scope, req.key, ctx=ctx)


def state_list(state: RedisState, req: ScopeRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return reads.list_values_plan(state, req.scope)


def state_list_keys(state: RedisState, req: ScopeRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return reads.list_keys_plan(state, req.scope)


def state_list_groups(state: RedisState, req: EmptyRequest, ctx: CallContext) -> Plan:
    return reads.list_groups_plan(state, validate.hidden_scopes(state))


def state_compare_and_set(state: RedisState, req: CompareAndSetRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    if req.value is msgspec.UNSET:
        raise InvalidRequest("$.value: the field `value` is required", {"path": "$.value"})
    expected = None
    if req.expected is not msgspec.UNSET:
        expected = validate.value(state.settings, req.expected, "expected")
    value = validate.value(state.settings, req.value)
    return writes.compare_and_set_plan(state, req.scope, req.key, expected, value,
                                       max_keys=validate.max_keys(req.max_keys), ctx=ctx)


def state_get_entry(state: RedisState, req: GetEntryRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    default = None
    if req.default is not msgspec.UNSET:
        default = msgspec.Raw(validate.value(state.settings, req.default, "default").json)
    return reads.get_entry_plan(state, req.scope, req.key, default=default, required=req.required)


def state_update(state: RedisState, req: ops.UpdateRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    if isinstance(req.topic, str):
        validate.topic(req.topic)
    encoded = ops.encode_ops(req.ops, state.settings.max_value_bytes)

    def finish(reply: UpdateReply) -> ops.UpdateResult:
        errors = ops.merge_errors(req.ops, encoded, reply.op_errors, positions=reply.positions)
        old = NULL if reply.old_value is None else msgspec.Raw(reply.old_value)
        return ops.UpdateResult(old, msgspec.Raw(reply.new_value), reply.version,
                                errors or msgspec.UNSET)

    return writes.update_plan(state,
        req.scope, req.key, encoded.args, finish, ttl_ms=validate.ttl_ms(req.ttl_ms),
        expected_version=validate.expected_version(req.expected_version),
        topic=KEEP if req.topic is msgspec.UNSET else req.topic,
        max_keys=validate.max_keys(req.max_keys), ctx=ctx,
    )


def state_list_entries(state: RedisState, req: listing.ListEntriesRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return listing.list_entries_plan(state, req)


def state_diff(state: RedisState, req: DiffRequest, ctx: CallContext,
               checked: codec.Value | None = None) -> Plan:
    """`checked`: as `state_set`'s."""
    validate.address(state, ctx, req.scope, req.key)
    return writes.diff_plan(state,
        req.scope, req.key, checked or validate.value(state.settings, req.value),
        update=req.update,
        expected_version=validate.expected_version(req.expected_version),
        max_keys=validate.max_keys(req.max_keys), ctx=ctx)


def state_update_topic(state: RedisState, req: UpdateTopicRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    plan = writes.update_topic_plan(state, req.scope, req.key, validate.topic(req.topic), ctx=ctx)
    return then(plan, UpdatedResult)


def state_delete_by_topic(state: RedisState, req: DeleteByTopicRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    validate.topic(req.topic_pattern)
    plan = listing.delete_by_topic_plan(state, req.scope, req.topic_pattern, ctx.by)
    return then(plan, DeletedResult)


def state_list_namespaces(state: RedisState, req: ListNamespacesRequest, ctx: CallContext) -> Plan:
    validate.pattern("pattern", req.pattern)
    validate.in_range("limit", req.limit, 1, listing.MAX_LIMIT)
    plan = listing.list_namespaces_plan(state, req.pattern, req.limit,
                                        validate.hidden_scopes(state))
    return then(plan, NamespacesResult)


def state_claim_namespace(state: RedisState, req: ClaimNamespaceRequest, ctx: CallContext) -> Plan:
    prefix = validate.functions_prefix(req.functions_prefix)
    validate.claimant(ctx, prefix)
    scopes = validate.claim_scopes(state.settings, req.scopes)
    return namespaces.claim_plan(state, prefix, scopes, Target(state.settings, "", "", ctx))


def state_barrier(state: RedisState, req: BarrierRequest, ctx: CallContext) -> Plan:
    """One arrival at a barrier; a bus call's id is its token, so a retry of the completing
    call gets the same `allow`."""
    config = barrier.parse_condition(state.settings, req.condition_config)
    return barrier.barrier_plan(state, req.event, config, ctx.call_id)


FUNCTIONS: dict[str, Prepare] = {
    "state::get": decoded(GetRequest, state_get),
    "state::set": decoded(SetRequest, state_set),
    "state::delete": decoded(DeleteRequest, state_delete),
    "state::list": decoded(ScopeRequest, state_list),
    "state::list_keys": decoded(ScopeRequest, state_list_keys),
    "state::list_groups": decoded(EmptyRequest, state_list_groups),
    "state::compare-and-set": decoded(CompareAndSetRequest, state_compare_and_set),
    "state::get-entry": decoded(GetEntryRequest, state_get_entry),
    "state::update": decoded(ops.UpdateRequest, state_update),
    "state::list-entries": decoded(listing.ListEntriesRequest, state_list_entries),
    "state::diff": decoded(DiffRequest, state_diff),
    "state::update-topic": decoded(UpdateTopicRequest, state_update_topic),
    "state::delete-by-topic": decoded(DeleteByTopicRequest, state_delete_by_topic),
    "state::list-namespaces": decoded(ListNamespacesRequest, state_list_namespaces),
    "state::barrier": decoded(BarrierRequest, state_barrier),
    "state::claim-namespace": decoded(ClaimNamespaceRequest, state_claim_namespace),
    **triggers.FUNCTIONS,
}


# Functions whose plans change nothing: a bus call's id is bound in the same pipeline as
# their first step (a reused id discards what they read).
READS = frozenset({"state::get", "state::get-entry", "state::list", "state::list_keys",
                   "state::list_groups", "state::list-entries", "state::list-namespaces",
                   "state::list-triggers"})


# Functions that address a scope (KeeperHub's `isolation: "workflow"` sets it from the call's
# context: engines/keeperhub/rules.py).
SCOPED = frozenset({"state::get", "state::set", "state::delete", "state::list",
                    "state::list_keys", "state::compare-and-set", "state::get-entry",
                    "state::update", "state::list-entries", "state::diff",
                    "state::update-topic", "state::delete-by-topic"})


class Catalog(NamedTuple):
    """The functions a service serves, which of them change nothing (`READS`), and what
    rewrites the body of each native function before it is decoded (an option every native
    function takes: KeeperHub's `isolation`, plugged in by engines/catalog.py)."""

    functions: Mapping[str, Prepare]
    reads: frozenset[str]
    rewrite: Rewrite | None = None


NATIVE = Catalog(FUNCTIONS, READS)


def prepare(state: RedisState, fn: str, body: bytes, ctx: CallContext,
            catalog: Catalog = NATIVE) -> Plan:
    """The plan of one call (its result: a Struct for `schemas.encoder`); a bad request
    raises StateError."""
    function = catalog.functions.get(fn)
    if function is None:
        private = namespaces.accessor(state, fn)
        if private is None:
            raise UnknownFunction(f"fn: unknown function {fn!r}; this service serves "
                                  f"{', '.join(sorted(catalog.functions))} and the accessors of "
                                  "claimed namespaces (<prefix>::state::get, ::list, "
                                  "::list_keys, ::compare-and-set)", {"fn": fn})
        fn, prefix = private
        function = FUNCTIONS[fn]
        ctx = msgspec.structs.replace(ctx, namespace=prefix)
    if fn in FUNCTIONS and (rewrite := catalog.rewrite) is not None:
        body = rewrite(fn, body, ctx)  # (the engines' own functions refuse fields they do not know)
    plan = function(state, body, ctx)
    if ctx.deadline_ms is not None and not plan.checks_deadline and now_ms() > ctx.deadline_ms:
        # (A plan whose script checks the deadline does so after the call's record: a call
        # applied in time is answered the same when it comes again late.)
        raise deadline_exceeded(ctx.deadline_ms)
    if ctx.call_id is not None and not plan.binds_call_id:
        plan = claimed(state, ctx, plan, fn in catalog.reads)
    return plan


def claimed(state: RedisState, ctx: CallContext, plan: Plan, read_only: bool) -> Plan:
    """`plan`, run only if its call id is free or already bound to this same call.

    An entry script records its call under the entry's partition, which makes a retry
    exactly-once; an id reused for a call in ANOTHER partition would not meet that record. So
    every bus call binds its id to its digest (function + body) in a key of the id's own
    (SET NX GET, kept as long as the records). The entry scripts do it themselves, first
    (`binds_call_id`); a read binds it in the same pipeline, before its own commands (what it
    read is dropped when the id is another call's); any other call binds it in a step before
    it runs, so a refused call never writes. The calls of one batch keep their order either
    way (a read does not overtake a write read before it).
    """
    claim: list[Arg] = ["SET", state.keys.call_claim(ctx.call_id or ""), ctx.call_digest or "",
                        "NX", "GET", "PX", state.settings.dedupe_window_ms]

    def check(reply: Any) -> None:
        held = command_reply(reply, "binding the call id")
        if held is not None and held.decode() != ctx.call_digest:
            raise CallIdReused(*STATUS_TEXTS[LUA_STATUS["CALL_ID_REUSED"]](
                Target(state.settings, "", "", ctx), []))

    if read_only:
        def read(replies: list[Any]) -> Any:
            check(replies[0])
            return plan.finish(replies[1:])

        return Plan([claim, *plan.commands], read, plan.checks_deadline)

    def bound(replies: list[Any]) -> Plan:
        check(replies[0])
        return plan

    return Plan([claim], bound)


async def call_json(state: RedisState, fn: str, body: bytes, ctx: CallContext,
                    catalog: Catalog = NATIVE) -> bytes:
    """Run one function on a JSON body; the result as JSON bytes. Errors raise StateError."""
    return encoder.encode(await state.execute(prepare(state, fn, body, ctx, catalog)))
