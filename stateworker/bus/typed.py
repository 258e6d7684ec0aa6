"""The typed helpers of `StateClient`: one method per `state::*` function, each a thin
`call(fn, body)` with the function's request built from Python arguments and its error codes
listed. Kept apart from the transport (bus/client.py: sends, retries; bus/reply_reader.py:
replies)."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterable
from typing import Any

from stateworker.codec import ABSENT


class TypedCalls(abc.ABC):
    """`state::*` as methods; the class that mixes it in provides `call`."""

    @abc.abstractmethod
    async def call(self, fn: str, body: Any, **options: Any) -> Any:
        """Call `fn` with `body` (Python values); the result as Python values."""

    async def get(self, scope: str, key: str) -> Any:
        """`state::get`: the stored value, or None when missing or expired.

        Args:
            scope: the group of keys.
            key: the key in it.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.get("orders", "o-1")`
        """
        return await self.call("state::get", {"scope": scope, "key": key})

    async def set(self, scope: str, key: str, value: Any, **options: Any) -> Any:
        """`state::set`: write a value (replacing its topic and expiry).

        Args:
            scope, key: where.
            value: any JSON-able value (tagged types allowed).
            **options: request fields: topic, ttl_ms, expected_version, create_only,
                max_keys.

        Returns: `{old_value, new_value, version, hash, created}`.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a bad option (ttl_ms, topic ...) or a
                value that cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): the value is over `max_value_bytes`.
            Conflict (CONFLICT): `expected_version` / `create_only` did not hold.
            KeyLimit (KEY_LIMIT): the key is new and the scope holds `max_keys` live keys.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.set("orders", "o-1", {"total": 12}, ttl_ms=60_000)`
        """
        return await self.call("state::set", {"scope": scope, "key": key, "value": value,
                                              **options})

    async def delete(self, scope: str, key: str) -> Any:
        """`state::delete`: remove a key; its old value (None when there was none).

        Args:
            scope, key: where.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.delete("orders", "o-1")`
        """
        return await self.call("state::delete", {"scope": scope, "key": key})

    async def list(self, scope: str) -> Any:
        """`state::list`: every live value of a scope, in key byte order.

        Args:
            scope: the scope (read whole: use `list_entries` to page a large one).

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.list("orders")`
        """
        return await self.call("state::list", {"scope": scope})

    async def list_keys(self, scope: str) -> Any:
        """`state::list_keys`: every live key of a scope, in byte order.

        Args:
            scope: the scope.

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.list_keys("orders")`
        """
        return (await self.call("state::list_keys", {"scope": scope}))["keys"]

    async def list_groups(self) -> Any:
        """`state::list_groups`: the scopes holding at least one entry, byte-sorted.

        Raises:
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.list_groups()`
        """
        return (await self.call("state::list_groups", {}))["groups"]

    async def update(self, scope: str, key: str, ops: builtins.list[dict[str, Any]], **options: Any) -> Any:
        """`state::update`: apply ops (set, remove, increment, decrement, merge, append).

        Ops that cannot apply are reported in the result's `errors` (by op index), not
        raised; the others are applied.

        Args:
            scope, key: where.
            ops: e.g. `{"type": "increment", "path": "total", "by": 1}`.
            **options: request fields: ttl_ms, expected_version, topic.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also malformed ops, too many ops, a bad option.
            ValueTooLarge (VALUE_TOO_LARGE): the updated value would be over
                `max_value_bytes` (nothing written).
            Conflict (CONFLICT): `expected_version` did not hold.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.update("orders", "o-1", [{"type": "set", "path": "paid", "value": True}])`
        """
        return await self.call("state::update", {"scope": scope, "key": key, "ops": ops,
                                                 **options})

    async def compare_and_set(self, scope: str, key: str, value: Any,
                              expected: Any = ABSENT) -> Any:
        """`state::compare-and-set`: write only if the stored value deep-equals `expected`.

        A mismatch is not an error: the result is `{"swapped": false, "current": ...}`.
        The entry keeps its topic and expiry.

        Args:
            scope, key: where.
            value: the new value.
            expected: the value that must be stored; left out or None: the key must be
                absent.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a value that cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): `value` or `expected` is over `max_value_bytes`.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.compare_and_set("orders", "o-1", {"total": 13}, expected={"total": 12})`
        """
        body = {"scope": scope, "key": key, "value": value}
        if expected is not ABSENT:
            body["expected"] = expected
        return await self.call("state::compare-and-set", body)

    async def get_entry(self, scope: str, key: str, **options: Any) -> Any:
        """`state::get-entry`: value with version, hash, topic, times, writer, revision.

        Args:
            scope, key: where.
            **options: request fields: default (returned when missing), required.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            NotFound (NOT_FOUND): `required=True` and the key is missing or expired.
            ValueTooLarge (VALUE_TOO_LARGE): `default` is over `max_value_bytes`.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.get_entry("orders", "o-1", required=True)`
        """
        return await self.call("state::get-entry", {"scope": scope, "key": key, **options})

    async def list_entries(self, scope: str, **options: Any) -> Any:
        """`state::list-entries`: one page of entries; `next_after` continues it.

        Args:
            scope: the scope.
            **options: request fields: prefix, key_pattern, topic_pattern, order_by
                (key, updated_at, topic), order (asc, desc), limit, offset, after,
                include_values.

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also limit/offset out of range, a cursor
                (`after`) not from list-entries, a pattern over 1024 bytes.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.list_entries("orders", topic_pattern="open*", limit=50)`
        """
        return await self.call("state::list-entries", {"scope": scope, **options})

    async def diff(self, scope: str, key: str, value: Any, **options: Any) -> Any:
        """`state::diff`: compare with the stored value by hash; write it only if changed
        (keeping topic and expiry).

        Args:
            scope, key: where.
            value: the value to compare (and write).
            **options: request fields: update (False: compare only), expected_version.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a value that cannot be JSON.
            ValueTooLarge (VALUE_TOO_LARGE): the value is over `max_value_bytes`.
            Conflict (CONFLICT): `expected_version` did not hold.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.diff("orders", "o-1", {"total": 12}, update=False)`
        """
        return await self.call("state::diff", {"scope": scope, "key": key, "value": value,
                                               **options})

    async def update_topic(self, scope: str, key: str, topic: str | None) -> Any:
        """`state::update-topic`: set or clear (None) an entry's topic; `{"updated": bool}`.

        Args:
            scope, key: where.
            topic: the new topic (at most 1024 bytes, no NUL), or None to clear it.

        Raises:
            InvalidRequest (INVALID_REQUEST): scope or key is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): scope or key is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a bad topic.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.update_topic("orders", "o-1", "closed")`
        """
        return await self.call("state::update-topic", {"scope": scope, "key": key,
                                                       "topic": topic})

    async def delete_by_topic(self, scope: str, topic_pattern: str) -> Any:
        """`state::delete-by-topic`: delete a scope's entries whose topic matches; the
        count (`{"deleted": n}`).

        Args:
            scope: the scope.
            topic_pattern: a topic, `*` the only wildcard.

        Raises:
            InvalidRequest (INVALID_REQUEST): the scope is not valid UTF-8 text.
            KeyTooLong (KEY_TOO_LONG): the scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): the scope is one the service keeps for itself,
                or one a private namespace claimed.
            InvalidRequest (INVALID_REQUEST): also a bad pattern (over 1024 bytes, NUL).
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.delete_by_topic("orders", "closed-*")`
        """
        return await self.call("state::delete-by-topic", {"scope": scope,
                                                          "topic_pattern": topic_pattern})

    async def claim_namespace(self, functions_prefix: str, scopes: Iterable[str]) -> Any:
        """`state::claim-namespace`: claim scopes for the private namespace of this client's
        `caller`; `{"claimed", "scopes", "functions"}`. From then on the public functions
        refuse them (RESERVED_SCOPE), listings leave them out, and only the accessors in
        `functions` (`<prefix>::state::get`, `::list`, `::list_keys`, `::compare-and-set`,
        callable by any client) serve them. All or nothing; the first claimant keeps a scope;
        `claimed` is false when nothing was new. Claims survive restarts.

        Args:
            functions_prefix: the namespace, `[A-Za-z0-9_-]+`; must be the client's `caller`.
            scopes: the scopes to claim (non-empty text each, at least one).

        Raises:
            InvalidPrefix (INVALID_PREFIX): `functions_prefix` is not `[A-Za-z0-9_-]+`.
            UnknownCaller (UNKNOWN_CALLER): the client has no `caller`.
            Forbidden (FORBIDDEN): `functions_prefix` is not the client's `caller`.
            InvalidScope (INVALID_SCOPE): no scope, or a scope that is not non-empty text.
            KeyTooLong (KEY_TOO_LONG): a scope is over `max_key_bytes`.
            ReservedScope (RESERVED_SCOPE): a scope the service keeps for itself.
            ScopeConflict (SCOPE_CONFLICT): another namespace owns a scope asked for;
                nothing was claimed.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await StateClient(caller="billing").claim_namespace("billing", ["ledger"])`
        """
        return await self.call("state::claim-namespace", {
            "functions_prefix": functions_prefix, "scopes": builtins.list(scopes)})

    async def barrier(self, event: Any, condition_config: dict[str, Any], **options: Any) -> Any:
        """`state::barrier`: record one arrival; `{"decision": "skip", "reason": ...}` until
        every expected key has arrived, then once `{"decision": "allow", "payload":
        {"results": {key: carried, ...}}, "reason": ...}`. The call's id is the arrival's
        token: a retry of the completing call (same `call_id`) gets the same `allow`.

        Args:
            event: the arrival (any JSON-able value), e.g. a state event.
            condition_config: `{id, expect, key_from?, carry?}` (see StateStore.barrier).
            **options: `call_json`'s keyword options (timeout, call_id, context,
                deadline_ms).

        Raises:
            BarrierConfig (BARRIER_CONFIG): condition_config missing or bad, or an `expect`
                other than the one the barrier's first arrival fixed.
            InvalidRequest (INVALID_REQUEST): the event has no arrival key at `key_from`.
            KeyTooLong (KEY_TOO_LONG): the arrival key is over `max_key_bytes`.
            ValueTooLarge (VALUE_TOO_LARGE): the carried value is over `max_value_bytes`, or
                the barrier's payload would pass 2 MiB.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.barrier({"key": "shard-1"}, {"id": "load-7", "expect": 3})`
        """
        return await self.call("state::barrier", {"event": event,
                                                  "condition_config": condition_config},
                               **options)

    async def list_namespaces(self, **options: Any) -> Any:
        """`state::list-namespaces`: `{"namespaces": [...]}`, the scopes holding entries,
        byte-sorted, filtered by `pattern` and cut at `limit`.

        Args:
            **options: request fields: pattern (`*` the only wildcard), limit (1..1000,
                default 100).

        Raises:
            InvalidRequest (INVALID_REQUEST): limit out of range, a pattern over 1024 bytes.
            CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE), InternalError (INTERNAL): as
                `call_json`.

        Example: `await client.list_namespaces(pattern="ord*", limit=10)`
        """
        return await self.call("state::list-namespaces", options)
