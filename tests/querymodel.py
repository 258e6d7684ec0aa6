"""An independent reference for `state::query` (not state/query/predicates.py): documents decoded
with every number as an exact Fraction, RFC 6901 pointers walked by hand, the ops as the
README states them. And the helpers the query tests share: raw JSON writes, every page of a
query, the reference over `list-entries`.
"""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import msgspec

from stateworker import StateStore

MISSING = object()


class Num(Fraction):
    """A JSON number (a Fraction that is never equal to a bool by type checks below)."""


def load(text: str | bytes) -> Any:
    return json.loads(text, parse_float=lambda t: Num(Fraction(t)),
                      parse_int=lambda t: Num(int(t)))


def walk(doc: Any, pointer: str) -> Any:
    if pointer == "":
        return doc
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(doc, dict):
            if token not in doc:
                return MISSING
            doc = doc[token]
        elif isinstance(doc, list):
            if not token.isdigit() or (token != "0" and token.startswith("0")) \
                    or int(token) >= len(doc):
                return MISSING
            doc = doc[int(token)]
        else:
            return MISSING
    return doc


def kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, Num):
        return "num"
    return {str: "str", list: "list", dict: "obj"}[type(v)]


def equal(a: Any, b: Any) -> bool:
    if kind(a) != kind(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return set(a) == set(b) and all(equal(a[k], b[k]) for k in a)
    return bool(a == b)


def holds(doc: Any, where: dict[str, Any]) -> bool:
    found = walk(doc, where["pointer"])
    op, value = where["op"], load(where["value"])
    if op == "exists":
        return (found is not MISSING) is value
    if found is MISSING:
        return False
    if op == "eq":
        return equal(found, value)
    if op == "ne":
        return not equal(found, value)
    if op == "in":
        return any(equal(found, v) for v in value)
    if op == "prefix":
        return isinstance(found, str) and found.encode().startswith(value.encode())
    if kind(found) != kind(value) or kind(found) not in ("num", "str"):
        return False
    a, b = (found.encode(), value.encode()) if isinstance(found, str) else (found, value)
    return bool({"lt": a < b, "lte": a <= b, "gt": a > b, "gte": a >= b}[op])


async def put(store: StateStore, scope: str, key: str, text: str, **more: Any) -> None:
    """state::set with the value as JSON text (its digits as written)."""
    body = json.dumps({"scope": scope, "key": key, **more})[:-1] + f', "value": {text}}}'
    await store.call_json("state::set", body.encode())


def where_body(wheres: list[dict[str, Any]]) -> str:
    return "[" + ",".join(
        f'{{"pointer": {json.dumps(w["pointer"])}, "op": {json.dumps(w["op"])}, '
        f'"value": {w["value"]}}}' for w in wheres) + "]"


class Entry(msgspec.Struct):
    key: str
    value: msgspec.Raw


class Page(msgspec.Struct):
    entries: list[Entry]
    next_after: str | None = None
    index: str | None = None


async def query_all(store: StateStore, scope: str, wheres: list[dict[str, Any]],
                    limit: int = 100) -> tuple[list[tuple[str, bytes]], set[str]]:
    """Every page of a query: (key, value text) in order, and the indexes the pages used."""
    out: list[tuple[str, bytes]] = []
    used: set[str] = set()
    after: str | None = None
    for _ in range(10_000):
        body = (f'{{"scope": {json.dumps(scope)}, "limit": {limit}, "where": '
                f'{where_body(wheres)}' + (f', "after": {json.dumps(after)}' if after else "")
                + "}")
        page = msgspec.json.decode(await store.call_json("state::query", body.encode()),
                                   type=Page)
        out += [(e.key, bytes(e.value)) for e in page.entries]
        if page.index is not None:
            used.add(page.index)
        after = page.next_after
        if after is None:
            return out, used
    raise AssertionError("the query never ended")


async def reference(store: StateStore, scope: str,
                    wheres: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """What a Python filter over every `list-entries` page keeps, in key order."""
    kept: list[tuple[str, bytes]] = []
    after: str | None = None
    while True:
        body: dict[str, Any] = {"scope": scope, "include_values": True, "limit": 1000}
        if after:
            body["after"] = after
        page = msgspec.json.decode(await store.call_json(
            "state::list-entries", msgspec.json.encode(body)), type=Page)
        for entry in page.entries:
            if all(holds(load(bytes(entry.value)), w) for w in wheres):
                kept.append((entry.key, bytes(entry.value)))
        after = page.next_after
        if after is None:
            return kept
