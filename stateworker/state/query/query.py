"""`state::query`: a page of a scope's entries whose values satisfy every `where` condition.

Where the filtering runs: here, in Python, over values a read fetched. The comparison must be
exact (a decimal text is never rounded through a double; big integers, exponents, `-0`), and
Python compares them exactly (predicates.Number: the digits and the decimal point's position,
any exponent) where Redis's Lua (doubles only) cannot; it also keeps one
evaluator for both paths, which the property tests hold to a reference. The work per call is
bounded: at most EXAMINE entries are fetched and examined (fewer when the conditions take
many steps an entry: predicates.MAX_WORK steps a page), and their values at most
max_call_bytes (the page stops after the value that reaches it; numbers.decode_cost counts a
non-integer number as more bytes), and `next_after` resumes
after the last one examined even when fewer than `limit` matched. A value is decoded in C
(predicates.decode_doc); only what a condition compares becomes an exact Number.

Two paths, chosen per page by the scope's ready indexes (one HGETALL of its definitions):
- no usable index: entries.lua walks the scope's key index from the cursor (EXAMINE members,
  expired ones skipped), values included, as list-entries does;
- a condition (eq, in, lt, lte, gt, gte, prefix) on a READY indexed pointer: its candidates are
  read from the index (ZRANGE BYLEX): eq and in walk their values' ranges, whose members are
  in key order, from the cursor; a range or prefix takes its whole candidate set when it holds
  at most CANDIDATES members (sorted by key here), else the page walks the keys. The
  candidates' entries are then read (GET, pipelined) and checked exactly like any other.
Results are in key byte order either way; with `order_by: updated_at` the page walks the
updated index (no value index: its members are in key order), ties broken by key.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from stateworker import clock
from stateworker.context import CallContext
from stateworker.errors import InvalidRequest
from stateworker.schemas import ListedEntry, QueryRequest, QueryResult
from stateworker.scripts.read_bindings import ENTRIES, entries_call
from stateworker.scripts.replies import EntriesReply
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import listing
from stateworker.state.kv.packed import Stored, unpack
from stateworker.state.kv.reads import hash_plan
from stateworker.state.query import predicates as p
from stateworker.state.query.numbers import decode_cost
from stateworker.transport.plans import Plan, command_reply

EXAMINE = 1000  # entries one query call examines at most
CANDIDATES = 1000  # a range's candidates taken from its index at most (else: the key walk)
MAX_LIMIT = 1000
_BAD_CURSOR = "$.after: not a cursor returned by state::query"
_DIGITS = re.compile(r"[0-9]{1,20}")  # an updated_at cursor's score (ASCII: Redis reads it)


Position = tuple[bytes, str]  # where a page resumes: after this key (and, by updated_at, score)


def decode_after(text: str, order_by: str) -> Position:
    """The key a cursor resumes after, and its score in the updated index (`updated_at`
    order; "" in key order): list-entries' cursor form."""
    try:
        padded = text + "=" * (-len(text) % 4)
        cursor = msgspec.json.decode(base64.urlsafe_b64decode(padded), type=listing.Cursor)
        key = base64.b64decode(cursor.member, validate=True)
    except (ValueError, binascii.Error, msgspec.DecodeError) as exc:
        raise InvalidRequest(_BAD_CURSOR, {"path": "$.after"}) from exc
    scored = order_by == "updated_at"
    if (cursor.order_by, cursor.order, cursor.skip) != (order_by, "asc", 0) or \
            scored != bool(_DIGITS.fullmatch(cursor.score)) or (not scored and cursor.score):
        raise InvalidRequest(f"{_BAD_CURSOR} with order_by {order_by}", {"path": "$.after"})
    return key, cursor.score


def encode_after(key: bytes, order_by: str = "key", score: str = "") -> str:
    return listing.encode_cursor(listing.Cursor(order_by, "asc",
                                                base64.b64encode(key).decode(), score, 0))


class Page:
    """One call's evaluation: the conditions, the limit, the matches so far."""

    def __init__(self, state: RedisState, req: QueryRequest, wheres: list[p.Where]) -> None:
        self.state, self.req, self.wheres = state, req, wheres
        self.result = QueryResult([])
        self.unknown: list[tuple[ListedEntry, bytes]] = []  # matches whose hash is unknown
        self.now = clock.now_ms()
        self.budget = state.settings.max_call_bytes  # bytes of values one page examines
        self.examined = 0
        # entries one page examines: EXAMINE, fewer when the conditions take many steps an
        # entry (predicates.work), so the page's evaluation stays within MAX_WORK steps
        self.examine = max(1, min(EXAMINE, p.MAX_WORK // p.work(wheres)))

    def take(self, key: bytes, e: Stored | None) -> bool:
        """Examine one entry (None: gone); True once the page is full or its values examined
        reach the byte budget."""
        if e is None or (e.expires is not None and e.expires <= self.now):
            return False
        self.examined += decode_cost(e.value)
        if not p.matches(self.wheres, p.decode_doc(e.value)):
            return self.examined >= self.budget
        entry = ListedEntry(key.decode(), e.topic, e.version, e.hash or "", _ms(e.created),
                            _ms(e.updated), _ms(e.expires), e.by, msgspec.Raw(e.value))
        self.result.entries.append(entry)
        if e.hash is None:
            self.unknown.append((entry, e.value))
        return len(self.result.entries) >= self.req.limit or self.examined >= self.budget

    def run(self, keys: list[bytes], rows: Sequence[Stored | None], more: bool) -> Any:
        """Examine `rows` (of `keys`, in the page's order); `more`: entries after the last
        remain. The page ends at the first entry that fills it (its `limit`, its byte budget)."""
        for i, (key, row) in enumerate(zip(keys, rows, strict=True)):
            if self.take(key, row):
                if i < len(keys) - 1 or more:
                    self.result.next_after = self.cursor(key, row)
                return self.finish()
        if more and keys:
            self.result.next_after = self.cursor(keys[-1], rows[-1])
        return self.finish()

    def cursor(self, key: bytes, row: Stored | None) -> str:
        """The cursor after `key`: by updated_at its score is the entry's `u` (the updated
        index's score)."""
        if self.req.order_by == "key":
            return encode_after(key)
        return encode_after(key, "updated_at", str(row.updated if row else 0))

    def finish(self) -> Any:
        if not self.unknown:
            return self.result
        steps = [hash_plan(self.state, self.req.scope, e.key, e.version, v)
                 for e, v in self.unknown]
        return listing._with_hashes(self.result, self.unknown, steps)  # type: ignore[arg-type]


def _ms(ms: int | None) -> str | None:
    return None if ms is None else clock.rfc3339_ms(ms)


def check(req: QueryRequest) -> tuple[list[p.Where], Position | None]:
    validate.in_range("limit", req.limit, 1, MAX_LIMIT)
    wheres = p.parse_where(req.where)
    return wheres, None if req.after is None else decode_after(req.after, req.order_by)


def state_query(state: RedisState, req: QueryRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    return query_plan(state, req)


def query_plan(state: RedisState, req: QueryRequest) -> Plan:
    wheres, after = check(req)
    part = state.keys.for_scope(req.scope)
    page = Page(state, req, wheres)

    def chosen(replies: list[Any]) -> Any:
        if req.order_by == "updated_at":  # (an index holds its members in key order)
            return _keys_plan(state, page, after)
        defs = command_reply(replies[0], "HGETALL")
        ready = {defs[i].decode(): True for i in range(0, len(defs), 2) if defs[i + 1] == b"r"}
        for eq_first in (True, False):
            for where in wheres:
                if where.pointer in ready and (where.op in ("eq", "in")) == eq_first:
                    ranges = p.index_ranges(where)
                    if ranges is not None:
                        return _index_plan(state, page, where.pointer, ranges,
                                           None if after is None else after[0])
        return _keys_plan(state, page, after)

    return state.read_plan((part,), [["HGETALL", part.index_defs(req.scope)]], chosen)


def _keys_plan(state: RedisState, page: Page, after: Position | None) -> Plan:
    """The page by walking the scope's key index, or its updated index (entries.lua)."""
    part = state.keys.for_scope(page.req.scope)
    position, score = (b"", "") if after is None else (b"=" + after[0], after[1])
    order_by = page.req.order_by
    index = (part.key_index if order_by == "key" else part.updated_index)(page.req.scope)

    def finish(reply: EntriesReply) -> Any:
        flat = reply.fields
        keys = [flat[i] for i in range(0, len(flat), 9)]
        rows = [_listed(flat[i + 1:i + 9]) for i in range(0, len(flat), 9)]
        page.result.index = msgspec.UNSET
        more = reply.last_member is not None
        if reply.last_member is not None and (not keys or reply.last_member != keys[-1]):
            # (the walk went past the last live entry: resume after what it examined)
            return _run_then(page, keys, rows, reply.last_member, reply.last_score)
        return page.run(keys, rows, more)

    call = entries_call(part, page.req.scope, index, order_by, "asc", position, score,
                        page.examine, 0, None, None, None, True, page.examine, page.budget)
    return state.script_plan(ENTRIES, call, finish)


def _listed(f: list[Any]) -> Stored:
    """An entry as entries.lua lists it (n h t c u x b v; the value given: values asked)."""
    n, h, t, c, u, x, b, v = f
    return Stored(v, int(n), int(c or 0), int(u or 0), (0, 0), None if h is None else h.hex(),
                  None if x is None else int(x), None if t is None else t.decode(),
                  None if b is None else b.decode())


def _run_then(page: Page, keys: list[bytes], rows: Sequence[Stored | None], last: bytes,
              last_score: bytes | None) -> Any:
    result = page.run(keys, rows, True)
    if len(page.result.entries) < page.req.limit:
        scored = page.req.order_by == "updated_at"  # (a key walk's score means nothing)
        page.result.next_after = encode_after(last, page.req.order_by,
                                              (last_score or b"").decode() if scored else "")
    return result


def _index_plan(state: RedisState, page: Page, pointer: str, ranges: p.Ranges,
                after: bytes | None) -> Any:
    """The page from the candidates of one indexed condition."""
    if not ranges.ranges:  # (`in` an empty list: nothing can match)
        page.result.index = pointer
        return page.run([], [], False)
    part = state.keys.for_scope(page.req.scope)
    index = part.value_index(page.req.scope, pointer)
    count = page.examine if ranges.ordered else CANDIDATES + 1
    commands: list[list[Any]] = []
    for start, end in ranges.ranges:
        low = b"[" + start if after is None or not ranges.ordered else b"(" + start + after
        commands.append(["ZRANGE", index, low, b"(" + end, "BYLEX", "LIMIT", 0, count])

    def candidates(replies: list[Any]) -> Any:
        found: set[bytes] = set()
        full = False
        for (start, _), members in zip(ranges.ranges, replies, strict=True):
            members = command_reply(members, "ZRANGE")
            full = full or len(members) >= count
            if ranges.ordered:
                found.update(m[len(start):] for m in members)
            else:
                found.update(p.key_of_member(m) for m in members)
        if not ranges.ordered and full:  # too many candidates: walk the keys instead
            return _keys_plan(state, page, None if after is None else (after, ""))
        keys = sorted(k for k in found if after is None or k > after)
        more = len(keys) > page.examine or (ranges.ordered and full)
        keys = keys[:page.examine]
        if not keys:
            page.result.index = pointer
            return page.run([], [], False)
        return _rows_plan(state, page, pointer, keys, more)

    return state.read_plan((part,), commands, candidates)


def _rows_plan(state: RedisState, page: Page, pointer: str, keys: list[bytes],
               more: bool) -> Plan:
    """The candidates' entries, read up to the one whose size reaches the byte budget (their
    STRLEN first: a page never reads a thousand large values to examine a few)."""
    part = state.keys.for_scope(page.req.scope)
    scope = page.req.scope
    names = [part.entry(scope, k.decode()) for k in keys]

    def sized(replies: list[Any]) -> Any:
        total, count = 0, len(keys)
        for i, r in enumerate(replies):
            total += int(command_reply(r, "STRLEN"))
            if total >= page.budget:
                count = i + 1
                break
        return state.read_plan((part,), [["GET", name] for name in names[:count]],
                               lambda got: finish(keys[:count], got, more or count < len(keys)))

    def finish(read: list[bytes], replies: list[Any], more: bool) -> Any:
        page.result.index = pointer
        rows = [command_reply(r, "GET") for r in replies]
        return page.run(read, [None if r is None else unpack(r) for r in rows], more)

    return state.read_plan((part,), [["STRLEN", name] for name in names], sized)
