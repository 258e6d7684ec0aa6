"""The `state::*` functions as JSON in, JSON out: what the bus and `StateStore.call` run.

Each handler decodes its request Struct, validates it, calls the store and returns a result
that `schemas.encoder` writes. Values stay `msgspec.Raw` the whole way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from stateworker import listing, ops, validate
from stateworker.errors import InvalidRequest, UnknownFunction
from stateworker.schemas import (
    NULL,
    CallContext,
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
from stateworker.store import RedisState

Handler = Callable[[RedisState, bytes, CallContext], Awaitable[Any]]


async def state_get(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, GetRequest)
    validate.address(state.settings, req.scope, req.key)
    found = await state.get(req.scope, req.key)
    return NULL if found is None else found


async def state_set(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, SetRequest)
    validate.address(state.settings, req.scope, req.key)
    raw = req.value if req.value is not msgspec.UNSET else req.data
    if raw is msgspec.UNSET:
        raise InvalidRequest("$.value: the field `value` (or `data`) is required",
                             {"path": "$.value"})
    return await state.set(
        req.scope,
        req.key,
        validate.value(state.settings, raw),
        topic=validate.topic(req.topic),
        ttl_ms=validate.ttl_ms(req.ttl_ms),
        expected_version=validate.expected_version(req.expected_version),
        create_only=req.create_only,
        ctx=ctx,
    )


async def state_delete(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, DeleteRequest)
    validate.address(state.settings, req.scope, req.key)
    return await state.delete(req.scope, req.key, ctx=ctx)


async def state_list(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, ScopeRequest)
    validate.scope(state.settings, req.scope)
    return await state.list_values(req.scope)


async def state_list_keys(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, ScopeRequest)
    validate.scope(state.settings, req.scope)
    return await state.list_keys(req.scope)


async def state_list_groups(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    validate.request(body, EmptyRequest)
    return await state.list_groups(validate.RESERVED_SCOPES)


async def state_compare_and_set(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, CompareAndSetRequest)
    validate.address(state.settings, req.scope, req.key)
    if req.value is msgspec.UNSET:
        raise InvalidRequest("$.value: the field `value` is required", {"path": "$.value"})
    expected = None
    if req.expected is not msgspec.UNSET:
        expected = validate.value(state.settings, req.expected, "expected")
    value = validate.value(state.settings, req.value)
    return await state.compare_and_set(req.scope, req.key, expected, value, ctx=ctx)


async def state_get_entry(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, GetEntryRequest)
    validate.address(state.settings, req.scope, req.key)
    default = None
    if req.default is not msgspec.UNSET:
        default = msgspec.Raw(validate.value(state.settings, req.default, "default").json)
    return await state.get_entry(req.scope, req.key, default=default, required=req.required)


async def state_update(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, ops.UpdateRequest)
    validate.address(state.settings, req.scope, req.key)
    if isinstance(req.topic, str):
        validate.topic(req.topic)
    op_args, checked = ops.encode_ops(req.ops, state.settings.max_value_bytes)
    reply = await state.update(
        req.scope, req.key, op_args, ttl_ms=validate.ttl_ms(req.ttl_ms),
        expected_version=validate.expected_version(req.expected_version),
        topic=req.topic, ctx=ctx,
    )
    _, old, new, version, _created, _written, from_script = reply
    errors = ops.merge_errors(checked, from_script)
    return ops.UpdateResult(NULL if old is None else msgspec.Raw(old), msgspec.Raw(new),
                            version, errors or msgspec.UNSET)


async def state_list_entries(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, listing.ListEntriesRequest)
    validate.scope(state.settings, req.scope)
    return await listing.list_entries(state, req)


async def state_diff(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, DiffRequest)
    validate.address(state.settings, req.scope, req.key)
    return await state.diff(
        req.scope, req.key, validate.value(state.settings, req.value), update=req.update,
        expected_version=validate.expected_version(req.expected_version), ctx=ctx)


async def state_update_topic(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, UpdateTopicRequest)
    validate.address(state.settings, req.scope, req.key)
    updated = await state.update_topic(req.scope, req.key, validate.topic(req.topic), ctx=ctx)
    return UpdatedResult(updated)


async def state_delete_by_topic(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, DeleteByTopicRequest)
    validate.scope(state.settings, req.scope)
    validate.topic(req.topic_pattern)
    return DeletedResult(await listing.delete_by_topic(state, req.scope, req.topic_pattern,
                                                       ctx.by))


async def state_list_namespaces(state: RedisState, body: bytes, ctx: CallContext) -> Any:
    req = validate.request(body, ListNamespacesRequest)
    if not 1 <= req.limit <= listing.MAX_LIMIT:
        raise InvalidRequest(f"$.limit: must be between 1 and {listing.MAX_LIMIT}, got {req.limit}",
                             {"path": "$.limit", "limit": listing.MAX_LIMIT})
    names = await listing.list_namespaces(state, req.pattern, req.limit, validate.RESERVED_SCOPES)
    return NamespacesResult(names)


FUNCTIONS: dict[str, Handler] = {
    "state::get": state_get,
    "state::set": state_set,
    "state::delete": state_delete,
    "state::list": state_list,
    "state::list_keys": state_list_keys,
    "state::list_groups": state_list_groups,
    "state::compare-and-set": state_compare_and_set,
    "state::get-entry": state_get_entry,
    "state::update": state_update,
    "state::list-entries": state_list_entries,
    "state::diff": state_diff,
    "state::update-topic": state_update_topic,
    "state::delete-by-topic": state_delete_by_topic,
    "state::list-namespaces": state_list_namespaces,
}


def handler_for(fn: str) -> Handler:
    handler = FUNCTIONS.get(fn)
    if handler is None:
        raise UnknownFunction(f"fn: unknown function {fn!r}; this service serves "
                              f"{', '.join(sorted(FUNCTIONS))}", {"fn": fn})
    return handler


async def call_json(state: RedisState, fn: str, body: bytes, ctx: CallContext) -> bytes:
    """Run one function on a JSON body; the result as JSON bytes. Errors raise StateError."""
    result = await handler_for(fn)(state, body, ctx)
    return encoder.encode(result)
