"""`StateStore`: the async Python API, typed methods plus `call(fn, body)` as the bus runs it.

Typed methods take and return Python values; datetime, date, time, Decimal, UUID and bytes
travel as tagged JSON objects (pyvalues.py) and come back as their types. `call` and `call_json`
take and return plain JSON exactly as the bus does.

Here: opening a store, namespaces, barriers, events, the reaper and `call` / `call_json`. The
typed methods on keys and scopes (get, set, delete, compare_and_set, get_entry, the listings)
come from `KeyValueMethods` (keyvalue.py); what the typed methods return is in results.py.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import msgspec

from stateworker import pyvalues, specs
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.events.model import Event
from stateworker.events.reader import scope_events
from stateworker.settings import Settings
from stateworker.specs import Spec, spec_method, with_raises
from stateworker.state import expiry, functions, lifecycle
from stateworker.state.core import results
from stateworker.state.core.results import BarrierOutcome, Claim
from stateworker.state.core.store import RedisState
from stateworker.state.keyvalue import STORE, KeyValueMethods
from stateworker.state.reactive.barrier import barrier_plan, parse_condition


class StateStore(KeyValueMethods):
    """The state store; open it with `async with StateStore.open() as store`."""

    # What `call`, `call_json` and `typed` serve: the native functions here; the engines'
    # store (engines/catalog.py, `stateworker.StateStore`) serves theirs too, with the option
    # every native function takes there (KeeperHub's isolation).
    catalog: ClassVar[functions.Catalog] = functions.NATIVE

    def __init__(self, state: RedisState) -> None:
        """Wrap an open `RedisState`; use `StateStore.open()` instead.

        Args:
            state: the store's Redis side (settings, connection, script library).

        Raises: nothing.

        Example: `store = StateStore(state)`
        """
        self.state = state

    @property
    def settings(self) -> Settings:
        """The settings in force (the live ones change with state::on-config-change)."""
        return self.state.settings

    @classmethod
    @asynccontextmanager
    async def open(
        cls, redis_url: str | None = None, *, reaper: bool = True, **settings: Any
    ) -> AsyncIterator[StateStore]:
        """Open with settings from STATEWORKER_* variables, overridden by keyword arguments.

        No Redis URL anywhere: an embedded redis-server is started under `state_dir` (AOF on,
        unix socket) and stopped when the block ends; its data survives to the next open.

        Args:
            redis_url: `redis://host:port/db` or `unix:///path.sock`; default
                STATEWORKER_REDIS_URL, else the embedded Redis.
            reaper: run the TTL reaper while the store is open.
            **settings: `Settings` fields (prefix, partitions, max_value_bytes ...), or
                `settings=` a whole `Settings`.

        Raises:
            ConfigError: an invalid setting; a Redis that cannot be reached or used, has AOF
                off (unless allow_no_aof) or was created with other partitions; an embedded
                redis-server that does not start. (Not a StateError: no code.)

        Example: `async with StateStore.open("redis://localhost:6379/0", prefix="app") as store:`
        """
        async with lifecycle.open_state(redis_url, reaper=reaper, **settings) as state:
            state.access.serve(cls.catalog.specs)
            yield cls(state)

    # ---- typed methods (those on keys and scopes: KeyValueMethods) --------------------------
    @with_raises(specs.CLAIM_NAMESPACE, STORE)
    async def claim_namespace(self, functions_prefix: str, scopes: Iterable[str], *,
                              caller: str | None = None, adopt: bool = False) -> Claim:
        """Claim scopes for a private namespace (`state::claim-namespace`): from then on the
        public functions refuse them (RESERVED_SCOPE), listings leave them out, and only the
        namespace's accessors (`call("<prefix>::state::get", ...)`, `::list`, `::list_keys`,
        `::compare-and-set`) serve them. All or nothing; the first claimant of a scope keeps
        it; claiming again what is owned already returns `claimed=False`. A public scope in
        use (entries, a trigger naming it, a write within the dedupe window) is refused
        unless `adopt`. Claims are kept in Redis (they survive restarts) and every replica
        learns of them within a second; `release_namespace` gives scopes back.

        Args:
            functions_prefix: the namespace, `[A-Za-z0-9_-]+`: the claiming worker's name.
            scopes: the scopes to claim (non-empty text each, at least one).
            caller: who claims; None: `functions_prefix` itself (an in-process caller holds
                the Redis connection, so it may act as any worker). Over the bus the call's
                `caller` is used.
            adopt: take public scopes in use too (an admin's decision: logged, and named in
                the registry entry); without it such a scope is SCOPE_IN_USE.

        Returns: `Claim(claimed, scopes, functions, adopted)`.

        Example: `await store.claim_namespace("billing", ["billing-ledger"])`
        """
        body: dict[str, Any] = {"functions_prefix": functions_prefix,
                                "scopes": builtins.list(scopes)}
        if adopt:
            body["adopt"] = True
        result = await self.call("state::claim-namespace", body,
                                 caller=functions_prefix if caller is None else caller)
        return msgspec.convert(result, Claim)

    @with_raises(specs.BARRIER, STORE)
    async def barrier(self, event: Any, condition_config: Mapping[str, Any], *,
                      token: str | None = None) -> BarrierOutcome:
        """Record one arrival at a barrier: `skip` until every expected key has arrived, then
        `allow` exactly once, with each key's carried value.

        Args:
            event: the arrival (a JSON-able value; tagged types allowed), e.g. a state event.
            condition_config: `{id, expect, key_from?, carry?}`: the barrier's id; `expect`
                a count (1..10000) or a list of distinct keys (1..10000); `key_from` a JSON
                pointer to the arrival key in `event` (default `/key`; a non-string value
                counts as its JSON text); `carry` a JSON pointer to the value kept (default
                the whole event; a missing target keeps null).
            token: identifies the arrival: the token of the arrival that completed the
                barrier gets the same `allow` again (a repeated evaluation).

        Returns: `BarrierOutcome(decision, reason, payload)`; `payload` is
            `{"results": {key: carried, ...}}` on `allow`, else None. Skips: "barrier `id`:
            n/N arrived, waiting on K more" (a named set also names the first missing
            keys), "`a` already counted, still n/N" (its value replaced), a key outside a
            named set (not counted), "barrier `id` already complete".

        Example: `await store.barrier({"key": "shard-1", "rows": 10}, {"id": "load-7", "expect": 3})`
        """
        config = parse_condition(self.settings, msgspec.json.encode(
            pyvalues.to_json_tree(dict(condition_config))))
        body = msgspec.json.encode(pyvalues.to_json_tree(event))
        result = await self.state.execute(barrier_plan(self.state, body, config, token))
        return results.barrier_outcome(result)

    async def events(self, scope: str, after: str = "-") -> builtins.list[Event]:
        """The change events of a scope still in its stream, after revision `after`.

        Args:
            scope: the scope (its partition's stream is read and filtered to it).
            after: a revision (exclusive, as `Event.revision` / `Entry.revision`); "-": from the
                start. At most 10,000 stream entries are read per call.

        Raises:
            ConnectionLost: the connection to Redis broke (read directly: not a StateError).
            ReplyError: Redis answered with an error.

        Example: `events = await store.events("orders", after=entry.revision)`
        """
        return await scope_events(self.state.conn, self.state.keys, scope, after)

    async def reap_expired(self) -> int:
        """Delete every entry already expired now (the reaper does this on its own too);
        returns how many were deleted (one `state:deleted` event each).

        Raises:
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `deleted = await store.reap_expired()`
        """
        return await expiry.reap_expired(self.state)

    # ---- JSON, as the bus -------------------------------------------------------------------
    async def call_json(
        self, fn: str, body: bytes | str, *, caller: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Run function `fn` on a JSON body; returns the result's JSON. Raises StateError.

        Args:
            fn: a `state::*` function id (`state::get`, `state::update` ...), or an accessor
                of a claimed namespace (`<prefix>::state::get` ...).
            body: the request as JSON text (a JSON object).
            caller: recorded as the writer (`updated_by`, the event's `by`); the claimant
                of `state::claim-namespace`.
            context: a JSON object for the call; a string `execution_id` in it is recorded
                as the writer instead of `caller`.

        Raises:
            UnknownFunction (UNKNOWN_FUNCTION): no such function.
            InvalidRequest (INVALID_REQUEST): the body is not JSON, a field is missing or wrong
                (`details.path`).
            KeyTooLong (KEY_TOO_LONG), ReservedScope (RESERVED_SCOPE): scope or key refused.
            ValueTooLarge (VALUE_TOO_LARGE): a value is over `max_value_bytes`.
            Conflict (CONFLICT): `expected_version` / `create_only` did not hold.
            NotFound (NOT_FOUND): `required: true` of a missing entry.
            InvalidScope (INVALID_SCOPE): an accessor named a scope its namespace does not
                own; state::claim-namespace: a scope that is not non-empty text.
            InvalidPrefix (INVALID_PREFIX), UnknownCaller (UNKNOWN_CALLER), Forbidden
                (FORBIDDEN), ScopeConflict (SCOPE_CONFLICT), ScopeInUse (SCOPE_IN_USE):
                state::claim-namespace or state::release-namespace refused (see
                `claim_namespace`, `release_namespace`).
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.call_json("state::get", b'{"scope":"orders","key":"o-1"}')`
        """
        ctx = NO_CONTEXT if caller is None and not context else CallContext(
            caller=caller, context=dict(context or {}))
        data = body.encode() if isinstance(body, str) else body
        return await functions.call_json(self.state, fn, data, ctx, self.catalog)

    async def call(
        self, fn: str, body: Any, *, caller: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        """Like `call_json` with the body and result as plain JSON values (dicts, lists ...).

        No tagged types are converted here (the result is plain JSON, as the bus returns it).

        Args:
            fn: a `state::*` function id or an accessor (`<prefix>::state::get` ...).
            body: a JSON-able value, or JSON text as str/bytes (sent as is).
            caller, context: as `call_json`.

        Raises:
            TypeError: `body` holds a value msgspec cannot encode as JSON (before the call).
            InvalidRequest (INVALID_REQUEST): `body` holds NaN or an infinity (before the
                call: JSON has no form for them).
            StateError: as `call_json` (UNKNOWN_FUNCTION, INVALID_REQUEST, KEY_TOO_LONG,
                VALUE_TOO_LARGE, CONFLICT, NOT_FOUND, RESERVED_SCOPE, UNAVAILABLE, INTERNAL).

        Example: `await store.call("state::get", {"scope": "orders", "key": "o-1"})`
        """
        data = body if isinstance(body, bytes | str) else pyvalues.encode_plain(body)
        result = await self.call_json(fn, data, caller=caller, context=context)
        return msgspec.json.decode(result)

    # ---- the other functions, typed from their specs -----------------------------------------
    async def call_python(self, fn: str, body: Any, *, caller: str | None = None,
                          context: Mapping[str, Any] | None = None) -> Any:
        """Like `call`, with tagged types converted both ways (as the typed methods do).

        Args:
            fn, caller, context: as `call_json`.
            body: a JSON-able Python value (Decimal, datetime, UUID, bytes ... tagged).

        Raises:
            StateError: as `call_json`.

        Example: `await store.call_python("state::update", {"scope": "s", "key": "k", "ops": []})`
        """
        data = pyvalues.encode_tree(body)
        return pyvalues.decode_value(await self.call_json(fn, data, caller=caller, context=context))

    async def typed(self, spec: Spec, request: msgspec.Struct, *, caller: str | None = None,
                    context: Mapping[str, Any] | None = None) -> Any:
        """Run `spec`'s function on its request Struct; its result as `spec.result` (values as
        raw JSON, `msgspec.Raw`), with the checks of a bus call and no JSON in between.

        Args:
            spec: a native function's spec (stateworker.specs), or an engine's that this
                store serves (its `catalog`).
            request: an instance of `spec.request`.
            caller, context: as `call_json`.

        Raises:
            UnknownFunction (UNKNOWN_FUNCTION): a function this store does not serve.
            StateError: the errors of the function (its spec's `raises`), UNAVAILABLE,
                INTERNAL.

        Example: `await store.typed(specs.GET, GetRequest("orders", "o-1"))`
        """
        ctx = NO_CONTEXT if caller is None and not context else CallContext(
            caller=caller, context=dict(context or {}))
        return await self.state.execute(functions.typed_plan(self.state, spec, request, ctx,
                                                             self.catalog))

    update = spec_method(specs.UPDATE, STORE)
    list_entries = spec_method(specs.LIST_ENTRIES, STORE)
    diff = spec_method(specs.DIFF, STORE)
    update_topic = spec_method(specs.UPDATE_TOPIC, STORE)
    delete_by_topic = spec_method(specs.DELETE_BY_TOPIC, STORE)
    list_namespaces = spec_method(specs.LIST_NAMESPACES, STORE)
    release_namespace = spec_method(specs.RELEASE_NAMESPACE, STORE)
    delete_barrier = spec_method(specs.DELETE_BARRIER, STORE)
    register_trigger = spec_method(specs.REGISTER_TRIGGER, STORE)
    keep_trigger = spec_method(specs.KEEP_TRIGGER, STORE)
    unregister_trigger = spec_method(specs.UNREGISTER_TRIGGER, STORE)
    list_triggers = spec_method(specs.LIST_TRIGGERS, STORE)
    transaction = spec_method(specs.TRANSACTION, STORE)
    set_many = spec_method(specs.SET_MANY, STORE)
    delete_many = spec_method(specs.DELETE_MANY, STORE)
    get_many = spec_method(specs.GET_MANY, STORE)
    delete_by_prefix = spec_method(specs.DELETE_BY_PREFIX, STORE)
    query = spec_method(specs.QUERY, STORE)
    create_index = spec_method(specs.CREATE_INDEX, STORE)
    drop_index = spec_method(specs.DROP_INDEX, STORE)
    list_indexes = spec_method(specs.LIST_INDEXES, STORE)
    ui_content = spec_method(specs.UI_CONTENT, STORE)
    list_entries_page = spec_method(specs.LIST_ENTRIES_PAGE, STORE)
    on_config_change = spec_method(specs.ON_CONFIG_CHANGE, STORE)
