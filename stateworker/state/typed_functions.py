"""The native functions' typed functions: each takes its decoded request Struct, validates it
(a StateError before anything is sent) and returns the store's Plan for it, whose result is a
Struct that `schemas.encoder` writes. Values stay `msgspec.Raw` the whole way.

`state/functions.py` pairs each with its spec (`NATIVE_SERVED`) and serves them from JSON
bodies; the engines' front-ends (`stateworker/engines/`) and `StateStore`'s hand-written
methods (state/keyvalue.py) call them themselves, so a translated call is checked and run
exactly as a native one. The functions of a family of their own are in its module
(`triggers.state_register_trigger`, `bulk.state_set_many` ...).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from stateworker import codec, specs
from stateworker.context import CallContext
from stateworker.errors import InvalidRequest
from stateworker.schemas import (
    NULL,
    BarrierRequest,
    ClaimNamespaceRequest,
    CompareAndSetRequest,
    DeleteBarrierRequest,
    DeleteByTopicRequest,
    DeletedResult,
    DeleteRequest,
    DiffRequest,
    EmptyRequest,
    GetEntryRequest,
    GetRequest,
    ListEntriesRequest,
    ListNamespacesRequest,
    NamespacesResult,
    ReleaseNamespaceRequest,
    ScopeRequest,
    SetRequest,
    UpdatedResult,
    UpdateRequest,
    UpdateResult,
    UpdateTopicRequest,
)
from stateworker.scripts.bindings import KEEP, writer_arg
from stateworker.scripts.replies import UpdateReply
from stateworker.scripts.statuses import Target
from stateworker.state.core import guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import listing, ops, reads, writes
from stateworker.state.reactive import barrier
from stateworker.state.tenancy import namespaces
from stateworker.transport.plans import Plan, then


def state_get(state: RedisState, req: GetRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    if ctx.answer is not None:
        answer = state.answer_here(ctx.answer, req.scope)
        # (on a cluster get.lua binds the id in the entry's slot: only an id at home there)
        if answer is not None and (not state.cluster or state.id_at_home(ctx, req.scope)):
            return reads.get_answered_plan(state, req.scope, req.key, ctx, answer)
    return then(reads.get_plan(state, req.scope, req.key), lambda found: NULL if found is None else found)


def state_set(state: RedisState, req: SetRequest, ctx: CallContext,
              checked: codec.Value | Callable[[], codec.Value] | None = None) -> Plan:
    """`checked`: the value as a front-end already checked it (Dagu's normalized form), or
    the check to make after the address's (StateStore's Python value), written instead of
    `req.value`."""
    validate.address(state, ctx, req.scope, req.key)
    if callable(checked):
        checked = checked()
    elif checked is None:
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
    return writes.delete_plan(state, req.scope, req.key, validate.delete_version(req.expected_version), ctx)


def state_list(state: RedisState, req: ScopeRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return reads.list_values_plan(state, req.scope)


def state_list_keys(state: RedisState, req: ScopeRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return reads.list_keys_plan(state, req.scope)


def state_list_groups(state: RedisState, req: EmptyRequest, ctx: CallContext) -> Plan:
    guard.every_scope(state, ctx)  # (moco's list_namespaces runs this too)
    return listing.list_groups_plan(state, validate.hidden_scopes(state))


def state_compare_and_set(
        state: RedisState, req: CompareAndSetRequest, ctx: CallContext,
        checked: Callable[[], tuple[codec.Value | None, codec.Value]] | None = None) -> Plan:
    """`checked`: the check of (expected, value) to make after the address's, instead of
    the request's (StateStore's Python values)."""
    validate.address(state, ctx, req.scope, req.key)
    if checked is not None:
        expected, value = checked()
        return writes.compare_and_set_plan(state, req.scope, req.key, expected, value,
                                           max_keys=validate.max_keys(req.max_keys), ctx=ctx)
    if req.value is msgspec.UNSET:
        raise InvalidRequest("$.value: the field `value` is required", {"path": "$.value"})
    expected = None
    if req.expected is not msgspec.UNSET:
        expected = validate.value(state.settings, req.expected, "expected")
    value = validate.value(state.settings, req.value)
    return writes.compare_and_set_plan(state, req.scope, req.key, expected, value,
                                       max_keys=validate.max_keys(req.max_keys), ctx=ctx)


def state_get_entry(state: RedisState, req: GetEntryRequest, ctx: CallContext,
                    checked: Callable[[], codec.Value] | None = None) -> Plan:
    """`checked`: the check of the default to make after the address's (StateStore's)."""
    validate.address(state, ctx, req.scope, req.key)
    default = None
    if checked is not None:
        default = msgspec.Raw(checked().json)
    elif req.default is not msgspec.UNSET:
        default = msgspec.Raw(validate.value(state.settings, req.default, "default").json)
    return reads.get_entry_plan(state, req.scope, req.key, default=default, required=req.required)


def state_update(state: RedisState, req: UpdateRequest, ctx: CallContext) -> Plan:
    validate.address(state, ctx, req.scope, req.key)
    if isinstance(req.topic, str):
        validate.topic(req.topic)
    encoded = ops.encode_ops(req.ops, state.settings.max_value_bytes)

    def finish(reply: UpdateReply) -> UpdateResult:
        errors = ops.merge_errors(req.ops, encoded, reply, state.settings.docs_url)
        old = NULL if reply.old_value is None else msgspec.Raw(reply.old_value)
        return UpdateResult(old, msgspec.Raw(reply.new_value), reply.version,
                                errors or msgspec.UNSET)

    return writes.update_plan(state,
        req.scope, req.key, encoded.args, finish, ttl_ms=validate.ttl_ms(req.ttl_ms),
        expected_version=validate.expected_version(req.expected_version),
        topic=KEEP if req.topic is msgspec.UNSET else req.topic,
        max_keys=validate.max_keys(req.max_keys), ctx=ctx,
        answers=not encoded.errors,  # (the script knows only the errors it finds itself)
    )


def state_list_entries(state: RedisState, req: ListEntriesRequest, ctx: CallContext) -> Plan:
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
    plan = listing.delete_by_topic_plan(state, req.scope, req.topic_pattern,
                                        writer_arg(ctx.by, ctx.trace))
    return then(plan, DeletedResult)


def state_list_namespaces(state: RedisState, req: ListNamespacesRequest, ctx: CallContext) -> Plan:
    validate.pattern("pattern", req.pattern)
    validate.in_range("limit", req.limit, 1, listing.MAX_LIMIT)
    hidden = validate.hidden_scopes(state)

    def listed(gone: frozenset[str]) -> Plan:
        return listing.list_namespaces_plan(state, req.pattern, req.limit, hidden | gone)

    return then(then(reads.expired_scopes_plan(state), listed), NamespacesResult)


def state_claim_namespace(state: RedisState, req: ClaimNamespaceRequest, ctx: CallContext) -> Plan:
    prefix = validate.functions_prefix(req.functions_prefix)
    validate.claimant(ctx, prefix)
    scopes = validate.claim_scopes(state.settings, req.scopes)
    guard.each_scope(state, ctx, scopes)
    adopter = None
    if req.adopt:
        guard.need_admin(state, ctx, specs.CLAIM_NAMESPACE.name, "adopt")
        adopter = validate.identity(ctx) or prefix
    return namespaces.claim_plan(state, prefix, scopes, Target(state.settings, "", "", ctx),
                                 adopter)


def state_release_namespace(state: RedisState, req: ReleaseNamespaceRequest,
                            ctx: CallContext) -> Plan:
    caller = validate.releaser(ctx, req.force)
    scopes = validate.claim_scopes(state.settings, req.scopes)
    guard.each_scope(state, ctx, scopes)
    if req.force:
        guard.need_admin(state, ctx, specs.RELEASE_NAMESPACE.name, "force")
    return namespaces.release_plan(state, caller, scopes, Target(state.settings, "", "", ctx),
                                   req.force)


def state_barrier(state: RedisState, req: BarrierRequest, ctx: CallContext) -> Plan:
    """One arrival at a barrier; a bus call's id is its token, so a retry of the completing
    call gets the same `allow`."""
    config = barrier.parse_condition(state.settings, req.condition_config,
                                     owner=ctx.principal)
    return barrier.barrier_plan(state, req.event, config, ctx.call_id)


def state_delete_barrier(state: RedisState, req: DeleteBarrierRequest, ctx: CallContext) -> Plan:
    """Delete a barrier (in `acl` mode one of the principal's own, as its arrivals name
    them: `<principal>/<id>`)."""
    return barrier.delete_plan(state, req.id, ctx.principal)
