"""`StateStore`: the async Python API, typed methods plus `call(fn, body)` as the bus runs it.

Typed methods take and return Python values; datetime, date, time, Decimal, UUID and bytes
travel as tagged JSON objects (codec.py) and come back as their types. `call` and `call_json`
take and return plain JSON exactly as the bus does.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from stateworker import codec
from stateworker.codec import ABSENT
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.events.model import Event
from stateworker.events.reader import scope_events
from stateworker.settings import Settings
from stateworker.state import expiry, functions, lifecycle, reads, validate, writes
from stateworker.state.barrier import barrier_plan, parse_condition
from stateworker.state.schemas import EntryResult
from stateworker.state.store import RedisState


class SetOutcome(msgspec.Struct, frozen=True):
    old_value: Any
    new_value: Any
    version: int
    hash: str
    created: bool


class Swap(msgspec.Struct, frozen=True):
    swapped: bool
    current: Any = None


class Claim(msgspec.Struct, frozen=True):
    claimed: bool  # False when the namespace already owned every scope asked for
    scopes: list[str]  # every scope the namespace owns, byte-sorted
    functions: list[str]  # its accessors: <prefix>::state::get, ::list, ::list_keys, ::compare-and-set


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    found: bool
    value: Any = None
    version: int | None = None
    hash: str | None = None
    topic: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    expires_at: str | None = None
    updated_by: str | None = None
    revision: str | None = None


class BarrierOutcome(msgspec.Struct, frozen=True):
    decision: str  # "allow" (once per barrier) or "skip"
    reason: str
    payload: Any = None  # allow: {"results": {key: carried value, ...}}


def _ctx(by: str | None) -> CallContext:
    """The context of a typed call: `by` is recorded as the writer (updated_by, event `by`)."""
    return NO_CONTEXT if by is None else CallContext(caller=by)


def _py(raw: msgspec.Raw) -> Any:
    return codec.decode_value(bytes(raw))


class StateStore:
    """The state store; open it with `async with StateStore.open() as store`."""

    def __init__(self, state: RedisState) -> None:
        """Wrap an open `RedisState`; use `StateStore.open()` instead.

        Args:
            state: the store's Redis side (settings, connection, script library).

        Raises: nothing.

        Example: `store = StateStore(state)`
        """
        self.state = state
        self.settings: Settings = state.settings

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
            yield cls(state)

    def _value(self, value: Any, field: str = "value") -> codec.Value:
        return codec.encode_value(value, field, self.settings.max_value_bytes)

    # ---- typed methods -----------------------------------------------------------------------
    async def get(self, scope: str, key: str) -> Any:
        """The stored value (tagged types converted back), or None when missing or expired.

        Args:
            scope: the group of keys.
            key: the key in it.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.get("orders", "o-1")`
        """
        validate.address(self.state, NO_CONTEXT, scope, key)
        raw = await self.state.execute(reads.get_plan(self.state, scope, key))
        return None if raw is None else _py(raw)

    async def set(
        self,
        scope: str,
        key: str,
        value: Any,
        *,
        topic: str | None = None,
        ttl_ms: int | None = None,
        expected_version: int | None = None,
        create_only: bool = False,
        max_keys: int | None = None,
        by: str | None = None,
    ) -> SetOutcome:
        """Write a value, replacing the entry's topic and expiry.

        Args:
            scope, key: where.
            value: any JSON-able value (datetime, date, time, Decimal, UUID, bytes tagged).
            topic: the entry's topic (at most 1024 bytes, no NUL); None: no topic.
            ttl_ms: expire after this many ms (1 ms to ten years); None: never.
            expected_version: write only if the stored version is this (0: absent).
            create_only: write only if the key is absent (as `expected_version=0`).
            max_keys: when the key is new, write only if the scope holds fewer live keys
                (KeeperHub's ceiling; overwriting is always allowed).
            by: recorded as the writer (`updated_by`, the event's `by`).

        Returns: `SetOutcome(old_value, new_value, version, hash, created)`.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a bad topic, ttl_ms or expected_version, or
                a value that cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): the value is over `max_value_bytes`.
            Conflict (CONFLICT): `expected_version` / `create_only` did not hold; nothing written.
            KeyLimit (KEY_LIMIT): the key is new and the scope holds `max_keys` live keys.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.set("orders", "o-1", {"total": 12}, topic="open", ttl_ms=60_000)`
        """
        validate.address(self.state, NO_CONTEXT, scope, key)
        result = await self.state.execute(writes.set_plan(self.state,
            scope, key, self._value(value), topic=validate.topic(topic),
            ttl_ms=validate.ttl_ms(ttl_ms),
            expected_version=validate.expected_version(expected_version),
            create_only=create_only, max_keys=validate.max_keys(max_keys), ctx=_ctx(by),
        ))
        return SetOutcome(_py(result.old_value), _py(result.new_value), result.version,
                          result.hash, result.created)

    async def delete(self, scope: str, key: str, *, by: str | None = None) -> Any:
        """Remove a key; its old value, or None when there was none.

        Args:
            scope, key: where.
            by: recorded as the writer of the `state:deleted` event.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.delete("orders", "o-1")`
        """
        validate.address(self.state, NO_CONTEXT, scope, key)
        return _py(await self.state.execute(writes.delete_plan(self.state, scope, key, ctx=_ctx(by))))

    async def list(self, scope: str) -> builtins.list[Any]:
        """Every live value of a scope, in key byte order (the whole scope: use
        `call("state::list-entries", ...)` to page a large one).

        Args:
            scope: the scope.

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.list("orders")`
        """
        validate.scope(self.state, NO_CONTEXT, scope)
        return [_py(raw) for raw in await self.state.execute(reads.list_values_plan(self.state, scope))]

    async def list_keys(self, scope: str) -> builtins.list[str]:
        """Every live key of a scope, in byte order.

        Args:
            scope: the scope.

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.list_keys("orders")`
        """
        validate.scope(self.state, NO_CONTEXT, scope)
        keys: builtins.list[str] = (await self.state.execute(reads.list_keys_plan(self.state, scope))).keys
        return keys

    async def list_groups(self) -> builtins.list[str]:
        """The scopes holding at least one entry, byte-sorted (reserved and claimed scopes
        left out).

        Raises:
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.list_groups()`
        """
        plan = reads.list_groups_plan(self.state, validate.hidden_scopes(self.state))
        groups: builtins.list[str] = (await self.state.execute(plan)).groups
        return groups

    async def compare_and_set(
        self, scope: str, key: str, value: Any, expected: Any = ABSENT, *, by: str | None = None
    ) -> Swap:
        """Write `value` only if the stored value deep-equals `expected` (ABSENT/None: absent).

        A mismatch is not an error: it returns `Swap(False, current)`. The entry keeps its
        topic and expiry.

        Args:
            scope, key: where.
            value: the new value.
            expected: the value that must be stored; ABSENT (left out) or None: the key must
                be absent.
            by: recorded as the writer.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also `value` or `expected` cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): `value` or `expected` is over `max_value_bytes`.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.compare_and_set("orders", "o-1", {"total": 13}, expected={"total": 12})`
        """
        validate.address(self.state, NO_CONTEXT, scope, key)
        want = None if expected is ABSENT else self._value(expected, "expected")
        result = await self.state.execute(writes.compare_and_set_plan(self.state,
            scope, key, want, self._value(value), ctx=_ctx(by)))
        if result.swapped:
            return Swap(True)
        assert isinstance(result.current, msgspec.Raw)
        return Swap(False, _py(result.current))

    async def get_entry(
        self, scope: str, key: str, *, default: Any = ABSENT, required: bool = False
    ) -> Entry:
        """The entry with its metadata: value, version, hash, topic, times, writer, revision.

        Args:
            scope, key: where.
            default: returned as `value` (with `found=False`) when the key is missing.
            required: a missing key raises NotFound instead.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            NotFound (NOT_FOUND): `required=True` and the key is missing or expired.
            InvalidRequest (INVALID_REQUEST): also a `default` that cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): `default` is over `max_value_bytes`.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `entry = await store.get_entry("orders", "o-1", required=True)`
        """
        validate.address(self.state, NO_CONTEXT, scope, key)
        fallback = None
        if default is not ABSENT:
            fallback = msgspec.Raw(self._value(default, "default").json)
        result = await self.state.execute(reads.get_entry_plan(self.state,
            scope, key, default=fallback, required=required))
        return _entry(result)

    async def claim_namespace(self, functions_prefix: str, scopes: Iterable[str], *,
                              caller: str | None = None) -> Claim:
        """Claim scopes for a private namespace (`state::claim-namespace`): from then on the
        public functions refuse them (RESERVED_SCOPE), listings leave them out, and only the
        namespace's accessors (`call("<prefix>::state::get", ...)`, `::list`, `::list_keys`,
        `::compare-and-set`) serve them. All or nothing; the first claimant of a scope keeps
        it; claiming again what is owned already returns `claimed=False`. Claims are kept in
        Redis (they survive restarts) and every replica learns of them within a second.

        Args:
            functions_prefix: the namespace, `[A-Za-z0-9_-]+`: the claiming worker's name.
            scopes: the scopes to claim (non-empty text each, at least one).
            caller: who claims; None: `functions_prefix` itself (an in-process caller holds
                the Redis connection, so it may act as any worker). Over the bus the call's
                `caller` is used.

        Returns: `Claim(claimed, scopes, functions)`.

        Raises:
            InvalidPrefix (INVALID_PREFIX): `functions_prefix` is not `[A-Za-z0-9_-]+`.
            Forbidden (FORBIDDEN): `caller` is not `functions_prefix`.
            InvalidScope (INVALID_SCOPE): no scope, or a scope that is not non-empty text.
            KeyTooLong (KEY_TOO_LONG): a scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): a scope the service keeps for itself.
            ScopeConflict (SCOPE_CONFLICT): another namespace owns a scope asked for (its
                details name it and the owner); nothing was claimed.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error.

        Example: `await store.claim_namespace("billing", ["billing-ledger"])`
        """
        body = {"functions_prefix": functions_prefix, "scopes": builtins.list(scopes)}
        result = await self.call("state::claim-namespace", body,
                                 caller=functions_prefix if caller is None else caller)
        return msgspec.convert(result, Claim)

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

        Raises:
            BarrierConfig (BARRIER_CONFIG): condition_config is missing or bad (the field is
                named), or its `expect` differs from the one the barrier's first arrival fixed.
            InvalidRequest (INVALID_REQUEST): the event has no arrival key at `key_from`
                (missing or null), or holds a value that cannot be JSON.
            KeyTooLong (KEY_TOO_LONG): the arrival key is over `max_key_bytes`.
            ValueTooLarge (VALUE_TOO_LARGE): the carried value is over `max_value_bytes`, or
                the payload would pass MAX_PAYLOAD_BYTES (2 MiB); nothing was written.
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.barrier({"key": "shard-1", "rows": 10}, {"id": "load-7", "expect": 3})`
        """
        config = parse_condition(self.settings, msgspec.json.encode(
            codec.to_json_tree(dict(condition_config))))
        body = msgspec.json.encode(codec.to_json_tree(event))
        result = await self.state.execute(barrier_plan(self.state, body, config, token))
        payload = None if result.payload is msgspec.UNSET else _py(result.payload)
        return BarrierOutcome(result.decision, result.reason, payload)

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
                (FORBIDDEN), ScopeConflict (SCOPE_CONFLICT): state::claim-namespace refused
                (see `claim_namespace`).
            Unavailable (UNAVAILABLE): the connection to Redis broke (the next call reconnects).
            InternalError (INTERNAL): Redis answered with an error (e.g. it refused to load the
                script library).

        Example: `await store.call_json("state::get", b'{"scope":"orders","key":"o-1"}')`
        """
        ctx = NO_CONTEXT if caller is None and not context else CallContext(
            caller=caller, context=dict(context or {}))
        data = body.encode() if isinstance(body, str) else body
        return await functions.call_json(self.state, fn, data, ctx)

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
            StateError: as `call_json` (UNKNOWN_FUNCTION, INVALID_REQUEST, KEY_TOO_LONG,
                VALUE_TOO_LARGE, CONFLICT, NOT_FOUND, RESERVED_SCOPE, UNAVAILABLE, INTERNAL).

        Example: `await store.call("state::get", {"scope": "orders", "key": "o-1"})`
        """
        data = body if isinstance(body, bytes | str) else msgspec.json.encode(body)
        result = await self.call_json(fn, data, caller=caller, context=context)
        return msgspec.json.decode(result)


def _entry(result: EntryResult) -> Entry:
    def opt(value: Any) -> Any:
        return None if value is msgspec.UNSET else value

    value = None if result.value is msgspec.UNSET else _py(result.value)
    return Entry(
        found=result.found, value=value, version=opt(result.version), hash=opt(result.hash),
        topic=opt(result.topic), created_at=opt(result.created_at),
        updated_at=opt(result.updated_at), expires_at=opt(result.expires_at),
        updated_by=opt(result.updated_by), revision=opt(result.revision),
    )
