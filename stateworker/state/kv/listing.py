"""Listing over the scope indexes: list-entries pages, delete-by-topic batches, namespaces
(list-namespaces and list_groups).

Nothing here SCANs the keyspace: every page starts from a position in a sorted index found in
O(log n) (entries.lua) and walks at most a bounded number of members.
"""

from __future__ import annotations

import base64
import binascii
import re
from bisect import bisect_right
from typing import Any

import msgspec
from msgspec import Raw, Struct

from stateworker import clock
from stateworker.errors import InvalidRequest
from stateworker.keys import PartitionKeys
from stateworker.patterns import glob_match, glob_parts
from stateworker.schemas import GroupsResult, ListedEntry, ListEntriesRequest, ListEntriesResult
from stateworker.scripts.bindings import DELTOPIC, deltopic_call
from stateworker.scripts.read_bindings import ENTRIES, entries_call
from stateworker.scripts.replies import DeltopicReply, EntriesReply
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv.reads import expired_scopes_plan, hash_plan
from stateworker.transport.plans import Plan, command_reply, then

MAX_LIMIT = 1000
MAX_OFFSET = 1_000_000_000
_INTEGER = re.compile(r"-?[0-9]{1,19}")
EXAMINE_PER_PAGE = 2000  # index members one list-entries call walks at most (and entries of
# max_call_bytes read at most: each read whole, its value returned or not)
DELETE_BATCH = 500  # index members one delete-by-topic script call examines at most


class Cursor(Struct, array_like=True):
    order_by: str
    order: str
    member: str  # base64 of the index member (bytes)
    score: str
    skip: int


def encode_cursor(cursor: Cursor) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(cursor)).decode().rstrip("=")


def decode_cursor(text: str, req: ListEntriesRequest) -> tuple[bytes, str, int]:
    try:
        padded = text + "=" * (-len(text) % 4)
        cursor = msgspec.json.decode(base64.urlsafe_b64decode(padded), type=Cursor)
        position = base64.b64decode(cursor.member)
    except (ValueError, binascii.Error, msgspec.DecodeError) as exc:
        raise InvalidRequest("$.after: not a cursor returned by state::list-entries",
                             {"path": "$.after"}) from exc
    if not (cursor.score == "" or _INTEGER.fullmatch(cursor.score)) or cursor.skip < 0:
        raise InvalidRequest("$.after: not a cursor returned by state::list-entries",
                             {"path": "$.after"})
    if (cursor.order_by, cursor.order) != (req.order_by, req.order):
        raise InvalidRequest(
            f"$.after: the cursor belongs to order_by={cursor.order_by} order={cursor.order}, "
            f"not order_by={req.order_by} order={req.order}", {"path": "$.after"})
    return position, cursor.score, cursor.skip


def check(req: ListEntriesRequest) -> None:
    validate.in_range("limit", req.limit, 1, MAX_LIMIT)
    validate.in_range("offset", req.offset, 0, MAX_OFFSET)
    for field in ("prefix", "key_pattern", "topic_pattern"):
        validate.pattern(field, getattr(req, field))


def list_entries_plan(state: RedisState, req: ListEntriesRequest) -> Plan:
    check(req)
    part = state.keys.for_scope(req.scope)
    index = {"key": part.key_index, "updated_at": part.updated_index,
             "topic": part.topic_index}[req.order_by](req.scope)
    position, score, skip = b"", "", req.offset
    if req.after is not None:
        member_bytes, score, skip = decode_cursor(req.after, req)
        position = b"=" + member_bytes

    def finish(reply: EntriesReply) -> Any:
        last_member, last_score, skip_left, flat = reply
        result = ListEntriesResult([_entry(req, flat[i:i + 9]) for i in range(0, len(flat), 9)])
        if last_member is not None:
            result.next_after = encode_cursor(Cursor(
                req.order_by, req.order, base64.b64encode(last_member).decode(),
                (last_score or b"").decode(), int(skip_left)))
        unknown = [(entry, flat[i * 9 + 8]) for i, entry in enumerate(result.entries)
                   if not entry.hash]
        if not unknown:
            return result
        # hashes an update left unknown: compute and store them, then answer
        steps = [hash_plan(state, req.scope, entry.key, entry.version, value)
                 for entry, value in unknown]
        return _with_hashes(result, unknown, steps)

    call = entries_call(part, req.scope, index, req.order_by, req.order, position, score,
                        req.limit, skip, req.prefix, req.key_pattern, req.topic_pattern,
                        req.include_values, EXAMINE_PER_PAGE, state.settings.max_call_bytes)
    return state.script_plan(ENTRIES, call, finish)


def _with_hashes(result: ListEntriesResult, unknown: list[tuple[ListedEntry, bytes]],
                 steps: list[Plan]) -> Plan:
    """One step storing every missing hash; then the page with the hashes filled in."""
    def finish(replies: list[Any]) -> ListEntriesResult:
        position = 0
        for (entry, _), step in zip(unknown, steps, strict=True):
            entry.hash = step.finish(replies[position:position + len(step.commands)])
            position += len(step.commands)
        return result

    return Plan([command for step in steps for command in step.commands], finish)


def _ms(raw: bytes | int | None) -> str | None:
    return None if raw is None else clock.rfc3339_ms(int(raw))


def _entry(req: ListEntriesRequest, f: list[Any]) -> ListedEntry:
    key, n, h, t, c, u, x, b, v = f
    entry = ListedEntry(key.decode(), None if t is None else t.decode(), int(n),
                        "" if h is None else h.hex(), _ms(c), _ms(u), _ms(x),
                        None if b is None else b.decode())
    if req.include_values:
        entry.value = Raw(v)
    return entry


def delete_by_topic_plan(state: RedisState, scope: str, pattern: str, writer: str = "") -> Plan:
    """Delete every entry whose topic matches, in bounded atomic batches (one step each);
    the result is the count. `writer`: bindings.writer_arg's (the writer, the call's trace)."""
    part = state.keys.for_scope(scope)
    # Index members are "<topic>\0<key>"; those with the pattern's literal start (or, with no
    # star, that exact topic) sort between it and it followed by byte 255 (never in UTF-8).
    if "*" in pattern:
        head = pattern.split("*", 1)[0].encode()
    else:
        head = pattern.encode() + b"\0"
    end = b"[" + head + b"\xff"

    return _deltopic_batch(state, part, scope, writer, pattern, b"[" + head, end, 0)


def _deltopic_batch(state: RedisState, part: PartitionKeys, scope: str, writer: str,
                    pattern: str, start: bytes, end: bytes, deleted: int) -> Plan:
    """One batch of a delete-by-topic, then the next from its cursor. (A module function,
    not a closure calling itself: that is a reference cycle per call, writes.py.)"""
    def finish(done: DeltopicReply) -> Any:
        total = deleted + done.deleted
        if done.cursor is None:
            return total
        return _deltopic_batch(state, part, scope, writer, pattern, b"(" + done.cursor, end,
                               total)

    call = deltopic_call(state.settings, part, scope, writer, pattern, start, end, DELETE_BATCH)
    return state.script_plan(DELTOPIC, call, finish)


# list-namespaces reads a partition's scopes index in chunks of this many members at first
# (at least: twice its even share of `limit`), each further chunk of a partition twice the last
# up to NAMESPACES_CHUNK_MAX: a sparse pattern takes a few round trips, never the whole index.
# (The names read above the merge's frontier wait, up to a chunk a partition: at 4,096 a
# chunk a step held the service's loop 27 to 35 ms at 300,000 scopes.)
NAMESPACES_CHUNK, NAMESPACES_CHUNK_MAX = 16, 1024


def list_groups_plan(state: RedisState, hidden: frozenset[str] = frozenset()) -> Plan:
    """Scopes holding at least one live entry, byte-sorted, `hidden` ones left out: every
    partition's scopes index read as list-namespaces reads it, a chunk at a time. One
    `ZRANGE 0 -1` of each index held Redis 21 ms a partition at 300,000 scopes, and sorting
    their names (a Python key per name) the service's loop 0.4 s."""
    return then(expired_scopes_plan(state), lambda gone: then(
        list_namespaces_plan(state, None, None, hidden | gone), GroupsResult))


def list_namespaces_plan(state: RedisState, pattern: str | None, limit: int | None,
                         hidden: frozenset[str], chunk: int | None = None) -> Plan:
    """The first `limit` scopes (byte order; None: all) matching `pattern` (None: every one),
    `hidden` ones left out, without reading every scope (list_groups: all of them, a chunk at
    a time). Each
    partition's scopes index has equal scores, so it is ordered by bytes and `BYLEX` reads
    only the range of the pattern's literal head (the text before its first `*`: from
    `[head` to `(head` and byte 255, which no UTF-8 scope holds), `LIMIT` a chunk at a time;
    the partitions' chunks merge in byte order.
    `chunk`: the first read of a partition (tests force many steps with 1)."""
    parts = None if pattern is None else glob_parts(pattern)
    if parts is None or (parts[0] == "" and len(parts) > 1):
        start, end = b"-", b"+"
    elif len(parts) == 1:  # (no star: the one scope of that name)
        start = end = b"[" + parts[0].encode()
    else:
        start, end = b"[" + parts[0].encode(), b"(" + parts[0].encode() + b"\xff"
    partitions = {part.scopes: part for part in state.keys.all_partitions()}
    if chunk is None:  # (every scope: a first step of NAMESPACES_CHUNK_MAX in all, not each)
        share = NAMESPACES_CHUNK_MAX if limit is None else 2 * limit
        chunk = min(NAMESPACES_CHUNK_MAX, max(NAMESPACES_CHUNK, -(-share // len(partitions))))
    walk = _ScopesWalk(state, partitions, parts, limit, hidden, end)
    return walk.read({key: (start, chunk) for key in partitions})


class _ScopesWalk:
    """A list-namespaces walk over the partitions' scopes indexes: what each has read and not
    yet given out, and where each goes on. Its steps' plans hold it; it holds no plan."""

    def __init__(self, state: RedisState, partitions: dict[str, PartitionKeys],
                 parts: list[str] | None, limit: int | None, hidden: frozenset[str],
                 end: bytes) -> None:
        self.state, self.partitions = state, partitions  # (each scopes index's partition)
        self.parts, self.limit, self.hidden, self.end = parts, limit, hidden, end
        self.found: list[str] = []
        self.pending: list[bytes] = []  # read, above the last step's frontier
        self.last: dict[str, tuple[bytes, int]] = {}  # a partition not read to the end:
        # its last member read, its last chunk

    def read(self, reads: dict[str, tuple[bytes, int]]) -> Plan:
        """One step: a chunk of each partition in `reads` (key: its range's start, count)."""
        order = list(reads)
        commands: list[list[Any]] = [["ZRANGE", key, start, self.end, "BYLEX", "LIMIT", 0,
                                      count] for key, (start, count) in reads.items()]

        def finish(replies: list[Any]) -> Any:
            for key, reply in zip(order, replies, strict=True):
                members: list[bytes] = command_reply(reply, "ZRANGE")
                self.pending += members
                if len(members) < reads[key][1]:
                    self.last.pop(key, None)  # (read to the end of its range)
                else:
                    self.last[key] = (members[-1], reads[key][1])
            return self.give()

        return self.state.read_plan([self.partitions[key] for key in order], commands, finish)

    def give(self) -> Any:
        """Every scope read up to the frontier (the least last member of the partitions not
        read to their end: below it every partition has been read) given out in byte order;
        the names when `limit` are found or all is read, else the next step: the partitions
        at the frontier, each a chunk twice its last."""
        frontier = min((member for member, _ in self.last.values()), default=None)
        self.pending.sort()  # (runs already in order: the sort merges them, in C)
        cut = len(self.pending) if frontier is None else bisect_right(self.pending, frontier)
        ready, self.pending = self.pending[:cut], self.pending[cut:]
        for member in ready:  # (a scope is in one partition's index only: no duplicate)
            scope = member.decode()
            if scope not in self.hidden and (self.parts is None or
                                             glob_match(scope, self.parts)):
                self.found.append(scope)
                if len(self.found) == self.limit:
                    return self.found
        if frontier is None:
            return self.found
        return self.read({key: (b"(" + member, min(NAMESPACES_CHUNK_MAX, 2 * count))
                          for key, (member, count) in self.last.items() if member == frontier})
