"""The write operations, as plans: set, compare-and-set, diff, update, update-topic, delete.

Each is one entry script call (bindings.py builds its KEYS and ARGV, reads its reply and turns
its error statuses into errors). Arguments arrive validated (validate.py); values arrive as
`codec.Value` (compact JSON + hash) and leave as `msgspec.Raw`, so no value is decoded on the
way through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from stateworker import codec
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.errors import Conflict, InternalError, shown
from stateworker.schemas import NULL, DiffResult, EntryResult, SetResult, SwapResult
from stateworker.scripts.bindings import (
    DELETE,
    KEEP,
    SET,
    TOPIC,
    UPDATE,
    Keep,
    delete_args,
    set_args,
    topic_args,
    update_args,
    version_condition,
)
from stateworker.scripts.replies import SetReply, UpdateReply
from stateworker.scripts.statuses import LUA_STATUS, STATUS_TEXTS, Target
from stateworker.state.core.store import RedisState
from stateworker.state.kv.reads import get_entry_plan, hash_plan
from stateworker.transport.plans import Plan, then
from stateworker.transport.wire import Arg

_OK, _NEEDS_HASH = LUA_STATUS["OK"], LUA_STATUS["NEEDS_HASH"]
_CONFLICT, _UNCHANGED = LUA_STATUS["CONFLICT"], LUA_STATUS["UNCHANGED"]


def _raw(value: bytes | None) -> msgspec.Raw:
    return NULL if value is None else msgspec.Raw(value)


def write_plan(state: RedisState, scope: str, key: str, value: codec.Value,
               finish: Callable[[SetReply], Any], *, topic: str | Keep | None = None,
               ttl_ms: int | Keep | None = None, condition: str = "", diff: bool = False,
               expected_version: int | None = None, create_only: bool = False,
               max_keys: int | None = None, ctx: CallContext = NO_CONTEXT,
               answers: bool = False) -> Plan:
    """set.lua; `finish` gets its reply. See the script for `condition`. A stored hash left
    unknown by an update is computed, stored and the write repeated. `max_keys`: the
    scope's ceiling of live keys for a write that creates one (KEY_LIMIT). `answers`: the
    result is state::set's, which the script writes itself for a bus call that lets it
    (context.Answer; entry.lua `entry_answer`)."""
    args = set_args(value, topic, ttl_ms, condition, diff, max_keys)
    target = state.target(scope, key, ctx, expected_version=expected_version,
                          create_only=create_only)
    accept = frozenset({_NEEDS_HASH, _CONFLICT}) if condition[:1] in ("h", "a") else \
        frozenset({_NEEDS_HASH})
    return _write_attempt(state, scope, key, target, args, finish, accept, 3, answers)


def _write_attempt(state: RedisState, scope: str, key: str, target: Target, args: list[Arg],
                   finish: Callable[[SetReply], Any], accept: frozenset[int], left: int,
                   answers: bool) -> Plan:
    """One run of set.lua; when the stored hash is unknown, that hash first, then again
    (`left` more times). A module function, not a closure calling itself: such a closure is a
    reference cycle, and a cycle per write kept Python's collector busy for 100+ ms at a time
    under load (docs/decisions/0044-no-reference-cycles.md)."""
    def check(read: SetReply) -> Any:
        if read.status != _NEEDS_HASH:
            return finish(read)
        if left == 0:
            raise InternalError(f"the hash of key {shown(key)} in scope {shown(scope)} kept changing")
        return then(hash_plan(state, scope, key, read.version, read.value or b""),
                    lambda _digest: _write_attempt(state, scope, key, target, args, finish,
                                                   accept, left - 1, answers))

    return state.entry_plan(SET, target, args, check, accept, answers)


def set_plan(state: RedisState, scope: str, key: str, value: codec.Value, *,
             topic: str | None = None, ttl_ms: int | None = None,
             expected_version: int | None = None, create_only: bool = False,
             max_keys: int | None = None, ctx: CallContext = NO_CONTEXT) -> Plan:
    def finish(reply: SetReply) -> SetResult:
        return SetResult(_raw(reply.value), msgspec.Raw(value.json), reply.version, value.hash,
                         reply.created)

    return write_plan(state, scope, key, value, finish, topic=topic, ttl_ms=ttl_ms,
                      condition=version_condition(expected_version, create_only),
                      expected_version=expected_version, create_only=create_only,
                      max_keys=max_keys, ctx=ctx, answers=True)


def compare_and_set_plan(state: RedisState, scope: str, key: str,
                         expected: codec.Value | None, value: codec.Value, *,
                         max_keys: int | None = None, ctx: CallContext = NO_CONTEXT) -> Plan:
    """Swap when the stored value deep-equals `expected` (None or null: absent); the entry
    keeps its topic and expiry."""
    def finish(reply: SetReply) -> SwapResult:
        if reply.status == _OK:
            return SwapResult(True)
        return SwapResult(False, _raw(reply.value))

    condition = "a" if expected is None or expected.json == b"null" else "h" + expected.hash
    return write_plan(state, scope, key, value, finish, topic=KEEP, ttl_ms=KEEP,
                      condition=condition, max_keys=max_keys, ctx=ctx)


def diff_plan(state: RedisState, scope: str, key: str, value: codec.Value, *,
              update: bool = True, expected_version: int | None = None,
              max_keys: int | None = None, ctx: CallContext = NO_CONTEXT) -> Plan:
    """Compare with the stored value by hash; write (keeping topic and expiry) only when it
    changed."""
    if not update:
        def compare(entry: EntryResult) -> DiffResult:
            stored = entry.version if isinstance(entry.version, int) else 0  # (0: absent)
            if expected_version is not None and expected_version != stored:
                # As with update: a stale expected_version is a conflict, written or not.
                target = state.target(scope, key, ctx, expected_version=expected_version)
                raise Conflict(*STATUS_TEXTS[_CONFLICT](target, [_CONFLICT, stored]))
            if not entry.found:
                return DiffResult(changed=True, found_previous=False)
            assert isinstance(entry.version, int) and isinstance(entry.hash, str)
            return DiffResult(changed=entry.hash != value.hash, found_previous=True,
                              previous_version=entry.version, previous=entry.value)

        return then(get_entry_plan(state, scope, key), compare)

    def finish(reply: SetReply) -> DiffResult:
        if reply.status == _UNCHANGED:
            return DiffResult(changed=False, found_previous=True, previous_version=reply.version,
                              previous=_raw(reply.value), version=reply.version, hash=value.hash)
        found = not reply.created
        return DiffResult(
            changed=True, found_previous=found,
            previous_version=reply.version - 1 if found else msgspec.UNSET,
            previous=_raw(reply.value) if found else msgspec.UNSET,
            version=reply.version, hash=value.hash,
        )

    return write_plan(state, scope, key, value, finish, topic=KEEP, ttl_ms=KEEP, diff=True,
                      condition="" if expected_version is None else f"v{expected_version}",
                      expected_version=expected_version, max_keys=max_keys, ctx=ctx)


def update_plan(state: RedisState, scope: str, key: str, op_args: Sequence[Arg],
                finish: Callable[[UpdateReply], Any], *, ttl_ms: int | None = None,
                expected_version: int | None = None, topic: str | Keep | None = KEEP,
                max_keys: int | None = None, ctx: CallContext = NO_CONTEXT,
                answers: bool = False) -> Plan:
    """update.lua with encoded ops (ops.encode_ops); `finish` gets its OK reply. No `ttl_ms`
    keeps the current expiry. `answers`: the result is state::update's, which the script
    writes itself when every op applied (context.Answer)."""
    target = state.target(scope, key, ctx, expected_version=expected_version)
    args = update_args(state.settings.max_value_bytes, expected_version, topic, ttl_ms, op_args,
                       max_keys)
    return state.entry_plan(UPDATE, target, args, finish, answers=answers)


def update_topic_plan(state: RedisState, scope: str, key: str, topic: str | None, *,
                      ctx: CallContext = NO_CONTEXT) -> Plan:
    return state.entry_plan(TOPIC, state.target(scope, key, ctx), topic_args(topic),
                            lambda reply: reply.found)


def delete_plan(state: RedisState, scope: str, key: str, expected_version: int | None = None,
                ctx: CallContext = NO_CONTEXT) -> Plan:
    """delete.lua; `expected_version`: delete only the entry at that version (CONFLICT
    otherwise, a missing key being at version 0)."""
    target = state.target(scope, key, ctx, expected_version=expected_version)
    return state.entry_plan(DELETE, target, delete_args(expected_version),
                            lambda reply: _raw(reply.old_value), answers=True)
