"""The `state::*` functions as JSON in, JSON out: what the bus and `StateStore.call` run.

Each function takes its decoded request Struct, validates it (a StateError before anything
is sent) and returns the store's Plan for it; the plan's result is a Struct that
`schemas.encoder` writes. Values stay `msgspec.Raw` the whole way. `NATIVE_SERVED` pairs
each function's spec (specs.py) with it; the engines' front-ends (`stateworker/engines/`)
call the typed functions themselves, so a translated call is checked and run exactly as a
native one. A `Catalog`, derived from what it serves, is what a service serves: the native
functions, or those and the engines'.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import msgspec

from stateworker import codec, specs
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import (
    InvalidRequest,
    ReservedScope,
    StateError,
    UnknownFunction,
    deadline_exceeded,
    shown,
)
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
    encoder,
)
from stateworker.scripts.bindings import KEEP, writer_arg
from stateworker.scripts.replies import UpdateReply
from stateworker.scripts.statuses import Target
from stateworker.specs import Spec
from stateworker.state import uifiles
from stateworker.state.core import config, guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import bulk, bulkread, listing, ops, pages, reads, transactions, writes
from stateworker.state.query import indexes, query
from stateworker.state.reactive import barrier, trigger_leases, triggers
from stateworker.state.tenancy import namespaces
from stateworker.transport.plans import Plan, then

Prepare = Callable[[RedisState, bytes, CallContext], Plan]


class Rewrite(NamedTuple):
    """What rewrites a native function's body before it is decoded (an option every native
    function takes, plugged in from above: KeeperHub's isolation). `apply(fn, body, ctx)`
    runs only on a body holding `marker`: nearly none do, and the rest never leave here."""

    marker: bytes
    apply: Callable[[str, bytes, CallContext], bytes]


R = TypeVar("R")
_ACCESSOR_TEXT = ", ".join(f"<prefix>::{name}" for name in specs.ACCESSORS)


def decoded(request_type: type[R], function: Callable[[RedisState, R, CallContext], Plan]
            ) -> Prepare:
    """`function` on a JSON body: the body decoded as `request_type` first (a malformed one
    is INVALID_REQUEST with `details.path`)."""
    def prepare_call(state: RedisState, body: bytes, ctx: CallContext) -> Plan:
        return function(state, validate.request(body, request_type), ctx)

    return prepare_call


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
    return reads.list_groups_plan(state, validate.hidden_scopes(state))


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
    plan = listing.list_namespaces_plan(state, req.pattern, req.limit,
                                        validate.hidden_scopes(state))
    return then(plan, NamespacesResult)


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


class Served(NamedTuple):
    """A function as a service serves it: its spec, its typed function (request Struct in,
    plan out: what engines and `StateStore.typed` call) and `prepare` (JSON body in)."""

    spec: Spec
    typed: Callable[[RedisState, Any, CallContext], Plan]
    prepare: Prepare


def served(spec: Spec, typed: Callable[[RedisState, Any, CallContext], Plan]) -> Served:
    """`spec` served by `typed`, its body decoded as `spec.request` (an engine decodes its
    own: engines/<engine>/functions.py builds its Served)."""
    return Served(spec, typed, decoded(spec.request, typed))


NATIVE_SERVED: tuple[Served, ...] = tuple(served(spec, typed) for spec, typed in (
    (specs.GET, state_get),
    (specs.SET, state_set),
    (specs.DELETE, state_delete),
    (specs.LIST, state_list),
    (specs.LIST_KEYS, state_list_keys),
    (specs.LIST_GROUPS, state_list_groups),
    (specs.COMPARE_AND_SET, state_compare_and_set),
    (specs.GET_ENTRY, state_get_entry),
    (specs.UPDATE, state_update),
    (specs.LIST_ENTRIES, state_list_entries),
    (specs.DIFF, state_diff),
    (specs.UPDATE_TOPIC, state_update_topic),
    (specs.DELETE_BY_TOPIC, state_delete_by_topic),
    (specs.LIST_NAMESPACES, state_list_namespaces),
    (specs.BARRIER, state_barrier),
    (specs.DELETE_BARRIER, state_delete_barrier),
    (specs.CLAIM_NAMESPACE, state_claim_namespace),
    (specs.RELEASE_NAMESPACE, state_release_namespace),
    (specs.REGISTER_TRIGGER, triggers.state_register_trigger),
    (specs.KEEP_TRIGGER, trigger_leases.state_keep_trigger),
    (specs.UNREGISTER_TRIGGER, triggers.state_unregister_trigger),
    (specs.LIST_TRIGGERS, triggers.state_list_triggers),
    (specs.TRANSACTION, transactions.state_transaction),
    (specs.SET_MANY, bulk.state_set_many),
    (specs.DELETE_MANY, bulk.state_delete_many),
    (specs.GET_MANY, bulkread.state_get_many),
    (specs.DELETE_BY_PREFIX, bulkread.state_delete_by_prefix),
    (specs.QUERY, query.state_query),
    (specs.CREATE_INDEX, indexes.state_create_index),
    (specs.DROP_INDEX, indexes.state_drop_index),
    (specs.LIST_INDEXES, indexes.state_list_indexes),
    (specs.UI_CONTENT, uifiles.state_ui_content),
    (specs.LIST_ENTRIES_PAGE, pages.state_list_entries),
    (specs.ON_CONFIG_CHANGE, config.state_on_config_change),
))


class Catalog:
    """The functions a service serves (the native ones, or those and the engines'), derived
    from their specs: `functions` (id -> prepare), `reads` (the read-only ones: a bus call's
    id is bound in the same pipeline as their first step), `scoped` (the native ones with a
    scope); and `rewrite`, what rewrites the body of each native function before it is decoded
    (an option every native function takes: KeeperHub's `isolation`, plugged in by
    engines/catalog.py, which sets a scoped function's scope from the call's context)."""

    def __init__(self, served: tuple[Served, ...], rewrite: Rewrite | None = None) -> None:
        self.rewrite = rewrite
        self.served = {entry.spec.name: entry for entry in served}
        if len(self.served) != len(served):
            raise ValueError("a function is served twice")
        self.functions: dict[str, Prepare] = {n: e.prepare for n, e in self.served.items()}
        self.reads = frozenset(n for n, e in self.served.items() if e.spec.read_only)
        self.scoped = frozenset(n for n, e in self.served.items()
                                if e.spec.scoped and e.spec.engine == "state")
        self.specs = tuple(entry.spec for entry in self.served.values())

    def joined(self, more: tuple[Served, ...], rewrite: Rewrite | None) -> Catalog:
        """This catalogue with `more` functions, and `rewrite` for the native ones."""
        return Catalog((*self.served.values(), *more), rewrite)


# The functions whose script writes a bus call's reply itself where the service lets it
# (context.Answer): set.lua renders state::set's SetResult and update.lua state::update's
# UpdateResult (every op applied, none refused in Python first), byte for byte as the
# service encodes them (tests/integration/bus/test_answered.py holds the two against each
# other); get.lua and delete.lua send the stored value as it is.
ANSWERED_IN_SCRIPT = frozenset({specs.SET.name, specs.GET.name, specs.DELETE.name,
                                specs.UPDATE.name})

NATIVE = Catalog(NATIVE_SERVED)
FUNCTIONS = NATIVE.functions  # the native functions (the accessors run these)
READS = NATIVE.reads
SCOPED = NATIVE.scoped


def prepare(state: RedisState, fn: str, body: bytes, ctx: CallContext,
            catalog: Catalog = NATIVE) -> Plan:
    """The plan of one call (its result: a Struct for `schemas.encoder`); a bad request
    raises StateError."""
    function = catalog.functions.get(fn)
    called = fn
    if function is None:
        private = namespaces.accessor(state, fn)
        if private is None:
            raise UnknownFunction(f"fn: unknown function {shown(fn)}; this service serves "
                                  f"{', '.join(sorted(catalog.functions))} and the accessors of "
                                  f"claimed namespaces ({_ACCESSOR_TEXT})", {"fn": fn})
        fn, prefix = private
        function = FUNCTIONS[fn]
        ctx = msgspec.structs.replace(ctx, namespace=prefix)
    if ctx.principal is not None:  # `acl` mode (state/core/guard.py)
        ctx = guard.admit(state, called, ctx, scoped=_names_scopes(catalog, called))
    if fn in FUNCTIONS and (rewrite := catalog.rewrite) is not None and rewrite.marker in body:
        body = rewrite.apply(fn, body, ctx)  # (the engines' functions refuse fields they lack)
    try:
        plan = function(state, body, ctx)
    except StateError as exc:
        if fn in SCOPED and not isinstance(exc, ReservedScope):
            validate.reserved_first(state, body, ctx, exc)
        raise
    if ctx.call_id is not None and not plan.binds_call_id:
        plan = state.claimed(ctx, plan, fn in catalog.reads)
    if ctx.deadline_ms is not None and not plan.checks_deadline and now_ms() > ctx.deadline_ms:
        # (A plan whose script checks the deadline does so after the call's record: a call
        # applied in time is answered the same when it comes again late.)
        raise deadline_exceeded(ctx.deadline_ms)
    return plan


def _names_scopes(catalog: Catalog, fn: str) -> bool:
    """Whether `fn`'s grants are checked per scope (validate.scope, guard.each_scope): a
    native function that addresses a scope or several (a claim), an accessor, and every
    engine function (whose scopes come from its context and pass validate.scope on their way
    to the native functions; one that lists every scope asks `guard.every_scope`)."""
    entry = catalog.served.get(fn)
    return entry is None or entry.spec.scoped or entry.spec.engine != "state" or \
        entry.spec in guard.PER_SCOPE


def typed_plan(state: RedisState, spec: Spec, request: Any, ctx: CallContext,
               catalog: Catalog = NATIVE) -> Plan:
    """The plan of `spec`'s function on its request Struct (`StateStore.typed`: in-process,
    so no call id to bind and no deadline)."""
    entry = catalog.served.get(spec.name)
    if entry is None:
        raise UnknownFunction(f"fn: {shown(spec.name)} is not served here; this store serves "
                              f"{', '.join(sorted(catalog.functions))}", {"fn": spec.name})
    return entry.typed(state, request, ctx)


async def call_json(state: RedisState, fn: str, body: bytes, ctx: CallContext,
                    catalog: Catalog = NATIVE) -> bytes:
    """Run one function on a JSON body; the result as JSON bytes. Errors raise StateError."""
    return encoder.encode(await state.execute(prepare(state, fn, body, ctx, catalog)))
