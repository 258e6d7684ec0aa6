"""`state::create-index`, `drop-index`, `list-indexes`: value indexes for `state::query`.

An index of (scope, pointer) is a sorted set of "<encoded value><key>" (state/query/predicates.py,
lua/includes/indexes.lua) that the write scripts keep themselves: entry.lua's `entry_write`
and `entry_unlink` call `indexes_change`, so set, update, compare-and-set, diff, delete,
delete-by-topic, the transaction and bulk scripts and the reaper all keep it true in the
script that changes the entry. A scope
without indexes pays one HGETALL of a missing hash per write.

Creating one defines it (state `building`), stores its definition durably as an entry of the
reserved scope `state_indexes` (so the snapshot keeps it and a restore brings it back:
`rebuild_all`), then builds it for the existing entries in batches of BUILD_BATCH keys (and
about max_call_bytes of entries read: each is read whole), one script each, at most
BATCHES_PER_CALL per call: a bigger scope answers `building: true`, and the next create-index
resumes where the build stopped. Until it is `ready` a query does not use it (it walks the
keys, still exact).
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from stateworker import codec
from stateworker.context import CallContext
from stateworker.errors import InvalidRequest, shown
from stateworker.keys import KeySpace, member
from stateworker.schemas import (
    CreateIndexResult,
    DropIndexResult,
    IndexesResult,
    IndexInfo,
    IndexRequest,
    ScopeIndexesRequest,
)
from stateworker.scripts.bindings import INDEX, index_call
from stateworker.scripts.replies import IndexReply
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import writes
from stateworker.state.kv.packed import unpack
from stateworker.state.query import predicates
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import Plan, command_reply, then

MAX_INDEXES = 16  # indexes of one scope
DEFINITIONS_CHUNK = 1000  # index definitions rebuild_all reads a step
BUILD_BATCH = 1000  # keys one build script indexes at most (and max_call_bytes of entries)
BATCHES_PER_CALL = 100  # build scripts one create-index call runs at most


def _definition_key(scope: str, pointer: str) -> str:
    """The definition's key in `state_indexes` (a digest: scope + pointer may be long)."""
    return hashlib.sha256(member(scope, pointer).encode()).hexdigest()


def _checked(state: RedisState, req: IndexRequest, ctx: CallContext) -> None:
    validate.scope(state, ctx, req.scope)
    predicates.pointer_parts(req.pointer, "$.pointer")


def state_create_index(state: RedisState, req: IndexRequest, ctx: CallContext) -> Plan:
    _checked(state, req, ctx)
    part = state.keys.for_scope(req.scope)

    def defined(reply: IndexReply) -> Plan:
        if reply.outcome < 0:
            raise InvalidRequest(
                f"$.pointer: scope {shown(req.scope)} has {MAX_INDEXES} indexes, the most a "
                f"scope may have; drop one first", {"path": "$.pointer", "limit": MAX_INDEXES})
        text = msgspec.json.encode({"scope": req.scope, "pointer": req.pointer})
        value = codec.value_from_json(text, "value", state.settings.max_value_bytes)
        stored = writes.diff_plan(state, validate.INDEXES_SCOPE,
                                  _definition_key(req.scope, req.pointer), value)
        return then(stored, lambda _diff: build_plan(state, req.scope, req.pointer,
                                                     reply.outcome == 1))

    call = index_call(part, req.scope, "create", req.pointer, MAX_INDEXES)
    return state.script_plan(INDEX, call, defined)


def build_plan(state: RedisState, scope: str, pointer: str, created: bool,
               batches: int | None = None) -> Plan:
    """Build batches until the index is ready (or dropped), at most `batches` of them
    (BATCHES_PER_CALL). (A module function, not a closure calling itself: writes.py's
    reference cycles.)"""
    part = state.keys.for_scope(scope)
    batches = BATCHES_PER_CALL if batches is None else batches

    def built(reply: IndexReply) -> Any:
        if reply.outcome == 0 and batches > 1:
            return build_plan(state, scope, pointer, created, batches - 1)
        return CreateIndexResult(created, reply.outcome == 0)

    call = index_call(part, scope, "build", pointer, BUILD_BATCH, state.settings.max_call_bytes)
    return state.script_plan(INDEX, call, built)


def state_drop_index(state: RedisState, req: IndexRequest, ctx: CallContext) -> Plan:
    _checked(state, req, ctx)
    part = state.keys.for_scope(req.scope)

    def dropped(reply: IndexReply) -> Plan:
        gone = writes.delete_plan(state, validate.INDEXES_SCOPE,
                                  _definition_key(req.scope, req.pointer))
        return then(gone, lambda _old: DropIndexResult(reply.outcome == 1))

    call = index_call(part, req.scope, "drop", req.pointer, 0)
    return state.script_plan(INDEX, call, dropped)


def state_list_indexes(state: RedisState, req: ScopeIndexesRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return list_plan(state, req.scope)


def list_plan(state: RedisState, scope: str) -> Plan:
    part = state.keys.for_scope(scope)
    keys = part.key_index(scope)

    def defined(replies: list[Any]) -> Any:
        defs = command_reply(replies[0], "HGETALL")
        found = sorted((defs[i], defs[i + 1]) for i in range(0, len(defs), 2))
        commands: list[list[Any]] = [["ZCARD", keys]]
        for _, mark in found:
            if mark[:1] == b"c":
                commands.append(["ZLEXCOUNT", keys, "-", b"[" + mark[1:]])

        def counted(replies: list[Any]) -> IndexesResult:
            total = int(command_reply(replies[0], "ZCARD"))
            counts = iter(replies[1:])
            out = []
            for pointer, mark in found:
                indexed = {b"r": total, b"b": 0}.get(mark[:1])
                if indexed is None:
                    indexed = int(command_reply(next(counts), "ZLEXCOUNT"))
                out.append(IndexInfo(pointer.decode(), "ready" if mark == b"r" else "building",
                                     indexed, total))
            return IndexesResult(out)

        return state.read_plan((part,), commands, counted)

    return state.read_plan((part,), [["HGETALL", part.index_defs(scope)]], defined)


async def rebuild_all(state: RedisState) -> int:
    """Define and build again every index whose definition `state_indexes` holds (after a
    restore, which brings the entries and the definitions back but no index); their count.
    The definitions are read as stored, not through state::list: the restore runs this
    before its last step, and reads are refused until then (list.lua's marker check)."""
    scope = validate.INDEXES_SCOPE
    part = state.keys.for_scope(scope)
    definitions: list[bytes] = []
    read = 0
    while names := await state.conn.execute("ZRANGE", part.key_index(scope), read,
                                            read + DEFINITIONS_CHUNK - 1):
        read += len(names)
        stored = await state.conn.pipeline([["GET", part.entry(scope, name.decode())]
                                            for name in names])
        for reply in stored:
            entry = command_reply(reply, "GET")
            if entry is not None:
                definitions.append(unpack(entry).value)
    for raw in definitions:
        found = msgspec.json.decode(raw)
        scope, pointer = found["scope"], found["pointer"]
        part = state.keys.for_scope(scope)
        await state.execute(state.script_plan(
            INDEX, index_call(part, scope, "create", pointer, MAX_INDEXES), lambda r: r))
        building = True
        while building:
            result = await state.execute(build_plan(state, scope, pointer, False))
            building = result.building
    return len(definitions)


async def building(conn: RedisConnection, keys: KeySpace) -> list[dict[str, Any]]:
    """`stateworker status`: every index still building, with its progress (at most 100 a
    partition)."""
    found = []
    for part in keys.all_partitions():
        for name in await conn.execute("ZRANGE", part.index_builds, 0, 99):
            colon = name.index(b":")
            length = int(name[:colon])
            scope = name[colon + 1:colon + 1 + length].decode()
            pointer = name[colon + 1 + length:].decode()
            mark = await conn.execute("HGET", part.index_defs(scope), pointer) or b"b"
            total = int(await conn.execute("ZCARD", part.key_index(scope)))
            indexed = total if mark == b"r" else 0 if mark == b"b" else int(await conn.execute(
                "ZLEXCOUNT", part.key_index(scope), "-", b"[" + mark[1:]))
            found.append({"scope": scope, "pointer": pointer, "indexed": indexed,
                          "total": total})
    return found
