"""`KeyValueMethods`: `StateStore`'s typed methods on keys and scopes, with Python results
(`SetOutcome`, `Swap`, `Entry`: results.py).

get, set, delete, compare_and_set and get_entry on one key; list, list_keys and list_groups on
scopes. Each runs its function's typed plan (state/typed_functions.py: the same checks as a bus
call) and carries its spec's one Raises text (specs.with_raises). `StateStore` (api.py)
inherits them; it adds opening, `call` / `call_json`, the other functions' typed methods,
namespaces, barriers, events and the reaper. Values go in through codec.py (tagged types,
`max_value_bytes`).
"""

from __future__ import annotations

import builtins
from typing import Any

from stateworker import codec, pyvalues, specs
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.pyvalues import ABSENT
from stateworker.schemas import (
    CompareAndSetRequest,
    DeleteRequest,
    EmptyRequest,
    GetEntryRequest,
    GetRequest,
    ScopeRequest,
    SetRequest,
)
from stateworker.specs import Face, with_raises
from stateworker.state import typed_functions
from stateworker.state.core import results
from stateworker.state.core.results import Entry, SetOutcome, Swap, py_value
from stateworker.state.core.store import RedisState

# StateStore's face: calls run in-process, so no TIMEOUT; Redis's errors are its own.
STORE = Face("call_python", "Unavailable (UNAVAILABLE): the connection to Redis broke (the next "
                            "call reconnects).\nInternalError (INTERNAL): Redis answered with an "
                            "error (e.g. it refused to load the script library).")


def _ctx(by: str | None) -> CallContext:
    """The context of a typed call: `by` is recorded as the writer (updated_by, event `by`)."""
    return NO_CONTEXT if by is None else CallContext(caller=by)


class KeyValueMethods:
    """The key and scope methods of `StateStore`, which sets `state`."""

    state: RedisState

    def _value(self, value: Any, field: str = "value") -> codec.Value:
        return pyvalues.encode_value(value, field, self.state.settings.max_value_bytes)

    @with_raises(specs.GET, STORE)
    async def get(self, scope: str, key: str) -> Any:
        """The stored value (tagged types converted back), or None when missing or expired.

        Args:
            scope: the group of keys.
            key: the key in it.

        Example: `await store.get("orders", "o-1")`
        """
        return py_value(await self.state.execute(typed_functions.state_get(self.state, GetRequest(scope, key),
                                                            NO_CONTEXT)))

    @with_raises(specs.SET, STORE)
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

        Example: `await store.set("orders", "o-1", {"total": 12}, topic="open", ttl_ms=60_000)`
        """
        req = SetRequest(scope, key, topic=topic, ttl_ms=ttl_ms,
                         expected_version=expected_version, create_only=create_only,
                         max_keys=max_keys)
        plan = typed_functions.state_set(self.state, req, _ctx(by), lambda: self._value(value))
        return results.set_outcome(await self.state.execute(plan))

    @with_raises(specs.DELETE, STORE)
    async def delete(self, scope: str, key: str, *, expected_version: int | None = None,
                     by: str | None = None) -> Any:
        """Remove a key; its old value, or None when there was none.

        Args:
            scope, key: where.
            expected_version: delete only the entry at this version (1 or more); another
                version, or no entry, is CONFLICT and nothing is deleted.
            by: recorded as the writer of the `state:deleted` event.

        Example: `await store.delete("orders", "o-1", expected_version=3)`
        """
        req = DeleteRequest(scope, key, expected_version=expected_version)
        plan = typed_functions.state_delete(self.state, req, _ctx(by))
        return py_value(await self.state.execute(plan))

    @with_raises(specs.LIST, STORE)
    async def list(self, scope: str) -> builtins.list[Any]:
        """Every live value of a scope, in key byte order (the whole scope: use
        `call("state::list-entries", ...)` to page a large one).

        Args:
            scope: the scope.

        Example: `await store.list("orders")`
        """
        plan = typed_functions.state_list(self.state, ScopeRequest(scope), NO_CONTEXT)
        return [py_value(raw) for raw in await self.state.execute(plan)]

    @with_raises(specs.LIST_KEYS, STORE)
    async def list_keys(self, scope: str) -> builtins.list[str]:
        """Every live key of a scope, in byte order.

        Args:
            scope: the scope.

        Example: `await store.list_keys("orders")`
        """
        plan = typed_functions.state_list_keys(self.state, ScopeRequest(scope), NO_CONTEXT)
        keys: builtins.list[str] = (await self.state.execute(plan)).keys
        return keys

    @with_raises(specs.LIST_GROUPS, STORE)
    async def list_groups(self) -> builtins.list[str]:
        """The scopes holding at least one entry, byte-sorted (reserved and claimed scopes
        left out).

        Example: `await store.list_groups()`
        """
        plan = typed_functions.state_list_groups(self.state, EmptyRequest(), NO_CONTEXT)
        groups: builtins.list[str] = (await self.state.execute(plan)).groups
        return groups

    @with_raises(specs.COMPARE_AND_SET, STORE)
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

        Example: `await store.compare_and_set("orders", "o-1", {"total": 13}, expected={"total": 12})`
        """
        def checked() -> tuple[codec.Value | None, codec.Value]:
            want = None if expected is ABSENT else self._value(expected, "expected")
            return want, self._value(value)

        plan = typed_functions.state_compare_and_set(self.state, CompareAndSetRequest(scope, key),
                                               _ctx(by), checked)
        return results.swap(await self.state.execute(plan))

    @with_raises(specs.GET_ENTRY, STORE)
    async def get_entry(
        self, scope: str, key: str, *, default: Any = ABSENT, required: bool = False
    ) -> Entry:
        """The entry with its metadata: value, version, hash, topic, times, writer, revision.

        Args:
            scope, key: where.
            default: returned as `value` (with `found=False`) when the key is missing.
            required: a missing key raises NotFound instead.

        Example: `entry = await store.get_entry("orders", "o-1", required=True)`
        """
        checked = None if default is ABSENT else lambda: self._value(default, "default")
        plan = typed_functions.state_get_entry(self.state, GetEntryRequest(scope, key,
                                                                     required=required),
                                         NO_CONTEXT, checked)
        return results.entry(await self.state.execute(plan))
