"""`KeyValueMethods`: `StateStore`'s typed methods on keys and scopes.

get, set, delete, compare_and_set and get_entry on one key; list, list_keys and list_groups on
scopes. `StateStore` (api.py) inherits them; it adds opening, `call` / `call_json`, namespaces,
barriers, events and the reaper. Values go in through codec.py (tagged types, `max_value_bytes`)
and come back through results.py.
"""

from __future__ import annotations

import builtins
from typing import Any

import msgspec

from stateworker import codec
from stateworker.codec import ABSENT
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.settings import Settings
from stateworker.state import reads, results, validate, writes
from stateworker.state.results import Entry, SetOutcome, Swap, py_value
from stateworker.state.store import RedisState


def _ctx(by: str | None) -> CallContext:
    """The context of a typed call: `by` is recorded as the writer (updated_by, event `by`)."""
    return NO_CONTEXT if by is None else CallContext(caller=by)


class KeyValueMethods:
    """The key and scope methods of `StateStore`, which sets `state` and `settings`."""

    state: RedisState
    settings: Settings

    def _value(self, value: Any, field: str = "value") -> codec.Value:
        return codec.encode_value(value, field, self.settings.max_value_bytes)

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
        return None if raw is None else py_value(raw)

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
        return results.set_outcome(result)

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
        return py_value(await self.state.execute(writes.delete_plan(self.state, scope, key, ctx=_ctx(by))))

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
        return [py_value(raw) for raw in await self.state.execute(reads.list_values_plan(self.state, scope))]

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
        return results.swap(result)

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
        return results.entry(result)
