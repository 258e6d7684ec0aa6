"""The `state::*` functions as JSON in, JSON out: what the bus and `StateStore.call` run.

`NATIVE_SERVED` pairs each native function's spec (specs.py) with its typed function (request
Struct in, Plan out: state/typed_functions.py, or its family's module) and decodes its JSON
body for it. A `Catalog`, derived from what it serves, is what a service serves: the native
functions, or those and the engines'. `prepare` makes one call's plan (the function found,
the caller admitted, the body rewritten and decoded, the call id bound, the deadline
checked); `call_json` runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import msgspec

from stateworker import specs
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import ReservedScope, StateError, UnknownFunction, deadline_exceeded, shown
from stateworker.schemas import encoder
from stateworker.specs import Spec
from stateworker.state import typed_functions, uifiles
from stateworker.state.core import config, guard, validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import bulk, bulkread, pages, transactions
from stateworker.state.query import indexes, query
from stateworker.state.reactive import trigger_leases, triggers
from stateworker.state.tenancy import namespaces
from stateworker.transport.plans import Plan

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
    (specs.GET, typed_functions.state_get),
    (specs.SET, typed_functions.state_set),
    (specs.DELETE, typed_functions.state_delete),
    (specs.LIST, typed_functions.state_list),
    (specs.LIST_KEYS, typed_functions.state_list_keys),
    (specs.LIST_GROUPS, typed_functions.state_list_groups),
    (specs.COMPARE_AND_SET, typed_functions.state_compare_and_set),
    (specs.GET_ENTRY, typed_functions.state_get_entry),
    (specs.UPDATE, typed_functions.state_update),
    (specs.LIST_ENTRIES, typed_functions.state_list_entries),
    (specs.DIFF, typed_functions.state_diff),
    (specs.UPDATE_TOPIC, typed_functions.state_update_topic),
    (specs.DELETE_BY_TOPIC, typed_functions.state_delete_by_topic),
    (specs.LIST_NAMESPACES, typed_functions.state_list_namespaces),
    (specs.BARRIER, typed_functions.state_barrier),
    (specs.DELETE_BARRIER, typed_functions.state_delete_barrier),
    (specs.CLAIM_NAMESPACE, typed_functions.state_claim_namespace),
    (specs.RELEASE_NAMESPACE, typed_functions.state_release_namespace),
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
