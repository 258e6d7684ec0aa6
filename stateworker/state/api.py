"""`StateStore`: the async Python API, typed methods plus `call(fn, body)` as the bus runs it.

Typed methods take and return Python values; datetime, date, time, Decimal, UUID and bytes
travel as tagged JSON objects (codec.py) and come back as their types. `call` and `call_json`
take and return plain JSON exactly as the bus does.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from stateworker import codec
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.events import reader as events
from stateworker.settings import Settings
from stateworker.state import expiry, functions, validate
from stateworker.state.schemas import EntryResult, Event
from stateworker.state.store import RedisState

ABSENT: Any = msgspec.UNSET  # compare_and_set's default `expected`: the key must be absent


class SetOutcome(msgspec.Struct, frozen=True):
    old_value: Any
    new_value: Any
    version: int
    hash: str
    created: bool


class Swap(msgspec.Struct, frozen=True):
    swapped: bool
    current: Any = None


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


def _ctx(by: str | None) -> CallContext:
    """The context of a typed call: `by` is recorded as the writer (updated_by, event `by`)."""
    return NO_CONTEXT if by is None else CallContext(caller=by)


def _py(raw: msgspec.Raw) -> Any:
    return codec.decode_value(bytes(raw))


class StateStore:
    """The state store; open it with `async with StateStore.open() as store`."""

    def __init__(self, state: RedisState) -> None:
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
        """
        async with RedisState.open(redis_url, reaper=reaper, **settings) as state:
            yield cls(state)

    def _value(self, value: Any, field: str = "value") -> codec.Value:
        return codec.encode_value(value, field, self.settings.max_value_bytes)

    # ---- typed methods -----------------------------------------------------------------------
    async def get(self, scope: str, key: str) -> Any:
        validate.address(self.settings, scope, key)
        raw = await self.state.execute(self.state.get_plan(scope, key))
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
        by: str | None = None,
    ) -> SetOutcome:
        validate.address(self.settings, scope, key)
        result = await self.state.execute(self.state.set_plan(
            scope, key, self._value(value), topic=validate.topic(topic),
            ttl_ms=validate.ttl_ms(ttl_ms),
            expected_version=validate.expected_version(expected_version),
            create_only=create_only, ctx=_ctx(by),
        ))
        return SetOutcome(_py(result.old_value), _py(result.new_value), result.version,
                          result.hash, result.created)

    async def delete(self, scope: str, key: str, *, by: str | None = None) -> Any:
        validate.address(self.settings, scope, key)
        return _py(await self.state.execute(self.state.delete_plan(scope, key, ctx=_ctx(by))))

    async def list(self, scope: str) -> builtins.list[Any]:
        validate.scope(self.settings, scope)
        return [_py(raw) for raw in await self.state.execute(self.state.list_values_plan(scope))]

    async def list_keys(self, scope: str) -> builtins.list[str]:
        validate.scope(self.settings, scope)
        keys: builtins.list[str] = (await self.state.execute(self.state.list_keys_plan(scope))).keys
        return keys

    async def list_groups(self) -> builtins.list[str]:
        plan = self.state.list_groups_plan(validate.RESERVED_SCOPES)
        groups: builtins.list[str] = (await self.state.execute(plan)).groups
        return groups

    async def compare_and_set(
        self, scope: str, key: str, value: Any, expected: Any = ABSENT, *, by: str | None = None
    ) -> Swap:
        """Write `value` only if the stored value deep-equals `expected` (ABSENT/None: absent)."""
        validate.address(self.settings, scope, key)
        want = None if expected is ABSENT else self._value(expected, "expected")
        result = await self.state.execute(self.state.compare_and_set_plan(
            scope, key, want, self._value(value), ctx=_ctx(by)))
        if result.swapped:
            return Swap(True)
        assert isinstance(result.current, msgspec.Raw)
        return Swap(False, _py(result.current))

    async def get_entry(
        self, scope: str, key: str, *, default: Any = ABSENT, required: bool = False
    ) -> Entry:
        validate.address(self.settings, scope, key)
        fallback = None
        if default is not ABSENT:
            fallback = msgspec.Raw(self._value(default, "default").json)
        result = await self.state.execute(self.state.get_entry_plan(
            scope, key, default=fallback, required=required))
        return _entry(result)

    async def events(self, scope: str, after: str = "-") -> builtins.list[Event]:
        """The change events of a scope still in its stream, after revision `after`."""
        return await events.read_events(self.state, scope, after)

    async def reap_expired(self) -> int:
        """Delete every entry already expired now (the reaper does this on its own too)."""
        return await expiry.reap_expired(self.state)

    # ---- JSON, as the bus -------------------------------------------------------------------
    async def call_json(
        self, fn: str, body: bytes | str, *, caller: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Run function `fn` on a JSON body; returns the result's JSON. Raises StateError."""
        ctx = NO_CONTEXT if caller is None and not context else CallContext(
            caller=caller, context=dict(context or {}))
        data = body.encode() if isinstance(body, str) else body
        return await functions.call_json(self.state, fn, data, ctx)

    async def call(
        self, fn: str, body: Any, *, caller: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> Any:
        """Like `call_json` with the body and result as plain JSON values (dicts, lists ...)."""
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
