"""`state::query`'s `where`: its checks, its exact evaluation and the order-preserving
encoding of an index member (pure code; the plans are in state/query/query.py).

Values are compared as JSON, exactly: a stored document is decoded by msgspec (`decode_doc`:
integers as exact ints, other numbers kept as their text, in C: numbers.py), and only the
values a condition compares become a `Number` (exact, any exponent: `1`, `1.0`, `1e0` and `10e-1` are
one number, `-0` is `0`, big integers and long decimals are never rounded through a double);
`true` is never the number 1; strings compare by their UTF-8 bytes (= code point order);
objects compare with key order ignored. What one entry's conditions may cost is counted in
steps (`work`, at most MAX_WORK), and a page examines as many entries as fit in MAX_WORK.

A pointer is RFC 6901 (parsed by `jsonpointer`; `""` is the whole value); it is resolved here
(not with `jsonpointer.resolve_pointer`, which indexes into a string as into an array): an
array step must be `0` or a number without a leading zero below its length.

The index encoding (`encode`) maps a scalar to bytes whose byte order is its order in a
query: null, false, true, numbers (negative, zero, positive), strings. The Lua include
`indexes.lua` writes the same bytes from a value's JSON text; the two are tested together.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import msgspec
from jsonpointer import JsonPointer, JsonPointerException

from stateworker import codec
from stateworker.errors import InvalidRequest, shown
from stateworker.schemas import WhereItem
from stateworker.state.query.numbers import (
    INT_DIGITS,
    Number,
    NumberText,
    decode,
    decode_doc,
    decode_in_c,
    exact,
    order,
)

__all__ = ["MAX_WORK", "MISSING", "Number", "NumberText", "Ranges", "Where", "decode",
           "decode_doc", "encode", "exact", "holds", "index_ranges", "key_of_member", "matches",
           "parse_where", "pointer_parts", "resolve", "same", "string_prefix", "work"]

OPS = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "exists", "prefix")
RANGE_OPS = ("lt", "lte", "gt", "gte")
MAX_WHERE = 16  # items of one `where`
MAX_IN = 100  # values of one `in`
MAX_POINTER_BYTES = 1024
# The conditions' steps a query page spends, at most (`work`: a page examines this many over
# their steps an entry, at least one entry), and so one entry's too. Each step is a node
# compared in Python, about 1 to 3 µs: a page of 1,000 entries of 1,001-int lists against an
# `eq` of such a list held the service's loop 3 s, with four `in`s of ten of them 39 s.
MAX_WORK = 20_000
_INDEX = re.compile(r"0|[1-9][0-9]*")
MISSING: Any = object()  # what an unresolvable pointer gives


class Where(NamedTuple):
    pointer: str
    parts: tuple[str, ...]
    op: str
    value: Any  # decoded (numbers as Number); a list for `in`


def pointer_parts(pointer: str, path: str) -> tuple[str, ...]:
    try:
        size = len(pointer.encode())
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"{path}: not valid UTF-8 text ({exc.reason})",
                             {"path": path}) from exc
    if size > MAX_POINTER_BYTES:
        raise InvalidRequest(f"{path}: a pointer is at most {MAX_POINTER_BYTES} bytes",
                             {"path": path, "limit": MAX_POINTER_BYTES})
    try:
        return tuple(JsonPointer(pointer).parts)
    except JsonPointerException as exc:
        raise InvalidRequest(f"{path}: {shown(pointer)} is not an RFC 6901 JSON pointer ({exc}); "
                             "use \"\" for the whole value or \"/a/0\"", {"path": path}) from exc


def parse_where(items: list[WhereItem]) -> list[Where]:
    if not 1 <= len(items) <= MAX_WHERE:
        raise InvalidRequest(f"$.where: must hold 1 to {MAX_WHERE} conditions, got {len(items)}",
                             {"path": "$.where", "limit": MAX_WHERE})
    wheres: list[Where] = []
    spent = 1  # (work's)
    for n, item in enumerate(items):
        where = _item(item, f"$.where[{n}]", MAX_WORK - spent)
        spent += len(where.parts) + _nodes(where.value)
        wheres.append(where)
    return wheres


def _item(item: WhereItem, at: str, left: int) -> Where:
    """One condition, within `left` steps of work (MAX_WORK less the conditions before)."""
    parts = pointer_parts(item.pointer, f"{at}.pointer")
    if item.op not in OPS:
        raise InvalidRequest(f"{at}.op: unknown op {shown(item.op)}; one of {', '.join(OPS)}",
                             {"path": f"{at}.op"})
    if item.value is msgspec.UNSET:
        raise InvalidRequest(f"{at}.value: the field `value` is required", {"path": f"{at}.value"})
    raw = bytes(item.value)
    lone = codec.surrogate_error(raw, f"{at}.value")
    if lone is not None:
        raise lone
    try:  # (counted in C first: the exact decoding makes a Number of each number in Python)
        steps = len(parts) + _nodes(decode_in_c(raw), left)
    except msgspec.DecodeError as exc:  # (an integer longer than a stored value may hold)
        raise InvalidRequest(f"{at}.value: not a JSON value a stored value may be ({exc}): an "
                             f"integer has at most {INT_DIGITS} digits",
                             {"path": f"{at}.value", "limit": INT_DIGITS}) from exc
    if steps > left:
        raise InvalidRequest(
            f"$.where: the conditions take more than {MAX_WORK} steps on each entry, the limit "
            f"(by {at}: 1, and each step of a pointer and each value or item of a value)",
            {"path": "$.where", "limit": MAX_WORK})
    try:
        value = decode(raw)
    except ValueError as exc:  # (msgspec checked the JSON: NaN, Infinity)
        raise InvalidRequest(f"{at}.value: not a JSON value ({exc})",
                             {"path": f"{at}.value"}) from exc
    kind = _kind(value)
    need: tuple[str, tuple[str, ...]] | None = {
        "exists": ("boolean", ("bool",)), "prefix": ("string", ("str",)),
        "in": ("list", ("list",))}.get(item.op)
    if item.op in RANGE_OPS:
        need = ("number or string", ("num", "str"))
    if need is not None and kind not in need[1]:
        raise InvalidRequest(f"{at}.value: op {item.op} takes a {need[0]}, got {shown(item.value)}",
                             {"path": f"{at}.value"})
    if item.op == "in" and len(value) > MAX_IN:
        raise InvalidRequest(f"{at}.value: op in takes at most {MAX_IN} values, got {len(value)}",
                             {"path": f"{at}.value", "limit": MAX_IN})
    return Where(item.pointer, parts, item.op, value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (Number, NumberText, int)):
        return "num"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "obj"


def resolve(doc: Any, parts: tuple[str, ...]) -> Any:
    """The value at `parts` in `doc`, or MISSING."""
    for part in parts:
        if isinstance(doc, dict):
            if part not in doc:
                return MISSING
            doc = doc[part]
        elif isinstance(doc, list):
            if not _INDEX.fullmatch(part) or int(part) >= len(doc):
                return MISSING
            doc = doc[int(part)]
        else:
            return MISSING
    return doc


Memo = dict[int, Number]  # one document's numbers made exact (numbers.exact)


def same(a: Any, b: Any, memo: Memo | None = None) -> bool:
    """Deep JSON equality: numbers by value, booleans apart from numbers, key order ignored.
    It stops at the first difference, so it costs at most the smaller side's nodes."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        return False
    if ka == "list":
        return len(a) == len(b) and all(same(x, y, memo) for x, y in zip(a, b, strict=True))
    if ka == "obj":
        return a.keys() == b.keys() and all(same(a[k], b[k], memo) for k in a)
    if ka == "num":
        return order(a, b, memo) == 0
    return bool(a == b)


def holds(where: Where, doc: Any, memo: Memo | None = None) -> bool:
    found = resolve(doc, where.parts)
    op, value = where.op, where.value
    if op == "exists":
        return (found is not MISSING) is value
    if found is MISSING:
        return False  # (`ne` too: a missing pointer is not "a different value")
    if op == "eq":
        return same(found, value, memo)
    if op == "ne":
        return not same(found, value, memo)
    if op == "in":
        return any(same(found, v, memo) for v in value)
    if op == "prefix":
        return _kind(found) == "str" and found.startswith(value)
    kind = _kind(found)
    if kind != _kind(value):  # a number is never lt a string; booleans and null never order
        return False
    sign = order(found, value, memo) if kind == "num" else (found > value) - (found < value)
    if op == "lt":
        return sign < 0
    if op == "lte":
        return sign <= 0
    return sign > 0 if op == "gt" else sign >= 0


def matches(wheres: list[Where], doc: Any) -> bool:
    """Every condition holds on `doc` (decode_doc's), each of its numbers read once."""
    memo: Memo = {}
    return all(holds(w, doc, memo) for w in wheres)


def work(wheres: list[Where]) -> int:
    """What examining one entry may cost, in steps (MAX_WORK): 1, and for each condition each
    step of its pointer and each node of its value (an `in`'s list and its items), which
    `same` may compare with the entry's node by node. (The stored value's own size is the
    byte budget's: decoding it, and reading each of its numbers once.)"""
    return 1 + sum(len(w.parts) + _nodes(w.value) for w in wheres)


def _nodes(value: Any, most: int | None = None) -> int:
    """The nodes of a decoded value (the value, each item and each member's value); counting
    stops once past `most`."""
    count, pending = 0, [value]
    while pending and (most is None or count <= most):
        node = pending.pop()
        count += 1
        if isinstance(node, dict):
            pending += node.values()
        elif isinstance(node, list):
            pending += node
    return count


# ---- the index encoding (the same bytes as lua/includes/indexes.lua) -----------------------------
NULL, FALSE, TRUE = b"\x01", b"\x02", b"\x03"
NEG, ZERO, POS = b"\x10", b"\x11", b"\x12"
STR, ODD = b"\x20", b"\x7f"  # ODD: a number whose point is out of the encoding's range
NUMBERS_END, STRINGS_END = b"\x13", b"\x21"
POINT_OFFSET = 10**15 * 2  # the decimal point's position + this: 16 digits
MAX_POINT = 10**15
_FLIP = bytes.maketrans(b"0123456789", b"9876543210")


def encode(value: Any) -> bytes | None:
    """A scalar's index bytes (a member is these + the key); None for a container or a number
    whose point is beyond +-10^15 (those go to the ODD bucket, always a candidate)."""
    value = exact(value)
    if value is None:
        return NULL
    if isinstance(value, bool):
        return TRUE if value else FALSE
    if isinstance(value, str):
        return STR + value.encode().replace(b"\0", b"\0\1") + b"\0\0"
    if isinstance(value, Number):
        return _number(value)
    return None


def string_prefix(text: str) -> bytes:
    """The start every encoded string with prefix `text` has."""
    return STR + text.encode().replace(b"\0", b"\0\1")


def _number(value: Number) -> bytes | None:
    if not value.digits:
        return ZERO
    if abs(value.point) > MAX_POINT:
        return None
    body = f"{value.point + POINT_OFFSET:016d}{value.digits}".encode()
    if value.negative:
        return NEG + body.translate(_FLIP) + b"\xfe"
    return POS + body + b"\x01"


def key_of_member(member: bytes) -> bytes:
    """The key at the end of an index member."""
    head = member[:1]
    if head in (NEG, POS):
        return member[member.index(b"\xfe" if head == NEG else b"\x01", 17) + 1:]
    if head == STR:
        return member[member.index(b"\0\0") + 2:]
    return member[1:]


class Ranges(NamedTuple):
    """Where the candidates of one indexed condition sit: lex ranges of the index; `ordered`:
    each range holds one encoded value (eq, in), so its members are in key order."""

    ranges: list[tuple[bytes, bytes]]  # (start prefix, end): ZRANGE BYLEX "[start" "(end"
    ordered: bool


def index_ranges(where: Where) -> Ranges | None:
    """The index ranges holding every entry `where` may match (plus the ODD bucket when it
    may hold one), or None when an index cannot answer it."""
    op, value = where.op, where.value
    if op in ("eq", "in"):
        values = value if op == "in" else [value]
        encoded = [encode(v) for v in values]
        if any(e is None for e in encoded):
            return None
        ranges = [(e, e + b"\xff") for e in encoded if e is not None]
        if any(isinstance(v, Number) for v in values):
            ranges.append((ODD, ODD + b"\xff"))
        return Ranges(ranges, True)
    if op == "prefix":
        start = string_prefix(value)
        return Ranges([(start, start + b"\xff")], False)
    if op in RANGE_OPS:
        e = encode(value)
        if e is None:
            return None
        low, high = (NEG, NUMBERS_END) if isinstance(value, Number) else (STR, STRINGS_END)
        bounds = {"lt": (low, e), "lte": (low, e + b"\xff"),
                  "gt": (e + b"\xff", high), "gte": (e, high)}[op]
        extra = [(ODD, ODD + b"\xff")] if isinstance(value, Number) else []
        return Ranges([bounds, *extra], False)
    return None
