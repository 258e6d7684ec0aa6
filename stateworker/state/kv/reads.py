"""The read operations, as plans: get, get-entry, list, list_keys, the scopes gone by expiry
(list_groups, in listing.py, leaves them out), and storing a hash that an update left unknown.

Reads of one key are one GET (the entry's stored form: packed.py) checked against the clock
here; an expired entry reads as missing before the reaper has deleted it. `list` and
`list_keys` read the scope in chunks, each one read-only script (list.lua) of at most
LIST_CHUNK keys and about LIST_BYTES of entries read (list_keys too: an entry is read whole
for its expiry), the next from the last key the one before
read: no script walks a whole scope (docs/decisions/0041), so a scope of 200,000 keys no
longer holds every other caller for a second. The result is still the whole scope, in key
byte order, each key once; being several scripts, it is not one point in time (a key
written while the chunks are read is listed as the chunk that reads it finds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from stateworker import clock, codec
from stateworker.clock import now_ms
from stateworker.context import Answer, CallContext
from stateworker.errors import NotFound, shown
from stateworker.keys import split_member
from stateworker.schemas import EntryResult, KeysResult
from stateworker.scripts.bindings import GET, SETHASH, get_call, sethash_call
from stateworker.scripts.read_bindings import LIST, list_call
from stateworker.scripts.replies import ListReply
from stateworker.scripts.statuses import LUA_STATUS, raise_for_status, script_reply
from stateworker.state.core.store import RedisState, answered_as
from stateworker.state.kv.packed import unpack
from stateworker.transport.plans import Plan, command_reply, then
from stateworker.transport.wire import Arg

_ANSWERED = LUA_STATUS["ANSWERED"]


def hash_plan(state: RedisState, scope: str, key: str, version: int, value: bytes) -> Plan:
    """Compute the hash an update left unknown, store it if the version still holds."""
    digest = codec.hash_tree(codec.decode_exact(value))
    call = sethash_call(state.keys.for_scope(scope), scope, key, version, digest)
    return state.script_plan(SETHASH, call, lambda _stored: digest)


def get_plan(state: RedisState, scope: str, key: str) -> Plan:
    """The stored JSON, or None when missing or expired."""
    part = state.keys.for_scope(scope)

    def finish(replies: list[Any]) -> msgspec.Raw | None:
        stored = command_reply(replies[0], "GET")
        if stored is None:
            return None
        entry = unpack(stored)
        if entry.expires is not None and entry.expires <= now_ms():
            return None
        return msgspec.Raw(entry.value)

    return state.read_plan((part,), [["GET", part.entry(scope, key)]], finish)


def get_answered_plan(state: RedisState, scope: str, key: str, ctx: CallContext,
                      answer: Answer) -> Plan:
    """A bus call's state::get answered by its own script (get.lua: its id bound, the value
    read and sent, its entry acknowledged; `answer`: RedisState.answer_here's): ANSWERED
    (REPLIED), the call's CALL_ID_REUSED, or the value when the script found the reply list
    on another node (a cluster's map gone stale) and left the reply to the service."""
    target = state.target(scope, key, ctx)
    answered = answered_as(answer)

    def finish(replies: list[Any]) -> Any:
        reply = script_reply(replies[0], GET.name)
        raise_for_status(reply, target)
        return answered if reply[0] == _ANSWERED else msgspec.Raw(reply[1])

    call = get_call(state.settings, state.keys, scope, key, ctx, answer, state.cluster)
    return Plan([GET.command(state.library, *call)], finish, binds_call_id=True)


def get_entry_plan(state: RedisState, scope: str, key: str, *,
                   default: msgspec.Raw | None = None, required: bool = False) -> Plan:
    part = state.keys.for_scope(scope)

    def finish(replies: list[Any]) -> Any:
        stored = command_reply(replies[0], "GET")
        e = None if stored is None else unpack(stored)
        if e is None or (e.expires is not None and e.expires <= now_ms()):
            if required:
                raise NotFound(f"key {shown(key)} not found in scope {shown(scope)}",
                               {"scope": scope, "key": key})
            return EntryResult(False) if default is None else EntryResult(False, default)

        def result(digest: str) -> EntryResult:
            return EntryResult(
                True, msgspec.Raw(e.value), e.version, digest, e.topic,
                clock.rfc3339_ms(e.created) or "", clock.rfc3339_ms(e.updated) or "",
                None if e.expires is None else clock.rfc3339_ms(e.expires), e.by,
                "{}-{}".format(*e.revision))

        if e.hash is None:  # left unknown by an update: compute and store it now
            return then(hash_plan(state, scope, key, e.version, e.value), result)
        return result(e.hash)

    return state.read_plan((part,), [["GET", part.entry(scope, key)]], finish)


LIST_CHUNK = 1000  # keys one list.lua script reads, at most (about 5 ms)
LIST_BYTES = 1 << 20  # entries one list.lua script reads: it stops after the one reaching this


def _list_plan(state: RedisState, scope: str, what: str,
               finish: Callable[[list[bytes]], Any]) -> Plan:
    part = state.keys.for_scope(scope)
    items: list[bytes] = []

    def chunk(after: bytes | None) -> Plan:
        call = list_call(part, scope, what, after, LIST_CHUNK, LIST_BYTES)
        return state.script_plan(LIST, call, read)

    def read(reply: ListReply) -> Any:
        items.extend(reply.items)
        return finish(items) if reply.last is None else chunk(reply.last)

    return chunk(None)


def list_values_plan(state: RedisState, scope: str) -> Plan:
    """Live values of a scope in key byte order."""
    return _list_plan(state, scope, "values", lambda items: [msgspec.Raw(v) for v in items])


def list_keys_plan(state: RedisState, scope: str) -> Plan:
    """Live keys of a scope in byte order."""
    return _list_plan(state, scope, "keys", lambda items: KeysResult([k.decode() for k in items]))


def expired_scopes_plan(state: RedisState) -> Plan:
    """The scopes whose every entry has expired and is not reaped yet, which a listing of
    scopes leaves out (an expired entry reads as missing; its scope holds none until the
    reaper drops it from the scopes index). Each partition's ttl index members due by now
    (the reaper keeps those few), counted by scope; then, for a scope that has some, as
    many of its key index's members plus one: none beyond the due ones is a scope gone."""
    parts = state.keys.all_partitions()
    due: list[list[Arg]] = [["ZRANGE", part.ttl, "-inf", now_ms(), "BYSCORE"] for part in parts]
    return state.read_plan(parts, due, lambda replies: _all_expired(state, replies))


def _all_expired(state: RedisState, due: list[Any]) -> Plan | frozenset[str]:
    counts: dict[str, int] = {}
    for reply in due:
        for name in command_reply(reply, "ZRANGE"):
            scope = split_member(name)[0]
            counts[scope] = counts.get(scope, 0) + 1
    if not counts:
        return frozenset()
    scopes = list(counts)
    parts = list({id(p): p for p in map(state.keys.for_scope, scopes)}.values())
    commands: list[list[Arg]] = [["ZRANGE", state.keys.for_scope(scope).key_index(scope), 0,
                                  counts[scope]] for scope in scopes]

    def gone(replies: list[Any]) -> frozenset[str]:
        return frozenset(scope for scope, reply in zip(scopes, replies, strict=True)
                         if len(command_reply(reply, "ZRANGE")) <= counts[scope])

    return state.read_plan(parts, commands, gone)
