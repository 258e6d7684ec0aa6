"""`state::query` agrees with an independent Python filter over `list-entries`
(tests/querymodel.py: exact Fractions, a hand-walked pointer) for random entries and random
predicates: decimals (1.10 vs 1.1), big integers, exponents, -0, strings with NUL, booleans,
null, nested objects, missing pointers and mixed types, paged with random limits. Then the
same with an index on every pointer (the pages must walk it), after random updates and deletes
under the index, and after entries under it expired (and were reaped)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.state.query import predicates
from tests.querymodel import put, query_all, reference

pytestmark = pytest.mark.anyio

NUMBERS = ["0", "-0", "0.0", "-0.0", "1", "1.0", "1.10", "1.1", "10e-1", "1e0", "1E+2", "100",
           "-1", "-1.5", "2.5", "0.1", "0.10000000000000001", "1e-7", "0.0000001",
           "9007199254740993", "9007199254740992", "9007199254740993.0",
           "123456789012345678901234567890", "123456789012345678901234567891",
           "-123456789012345678901234567890", "18446744073709551617", "1e400", "-2E-400"]
STRINGS = ['""', '"a"', '"ab"', '"b"', '"A"', '"1"', '"\\u00e9"', '"a\\u0000"', '"a\\u0000b"',
           '"\\ud83d\\ude00"', '"a/b"']
SCALARS = [*NUMBERS, *STRINGS, "true", "false", "null"]
POINTERS = ["/a", "/a", "/a", "/b/c", "/l/0", "/l/1", "", "/missing", "/a/x", "/a~1b"]

numbers = st.one_of(st.sampled_from(NUMBERS), st.integers(-(10**25), 10**25).map(str),
                    st.tuples(st.integers(-999, 999), st.integers(0, 999)).map(
                        lambda t: f"{t[0]}.{t[1]}"),
                    st.tuples(st.integers(-9, 9), st.integers(-30, 30)).map(
                        lambda t: f"{t[0]}e{t[1]}"))
# (mostly from one small pool, so that conditions meet the values they compare with)
scalars = st.one_of(st.sampled_from(SCALARS), st.sampled_from(SCALARS), numbers)
leaves = st.one_of(scalars, scalars, scalars, st.sampled_from(["[]", "{}", '{"x": 1}', "[1]"]))
present = st.integers(0, 3).map(bool)


@st.composite
def documents(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 5)) == 5:
        return draw(leaves)  # the whole value is a scalar (pointer "")
    fields = []
    if draw(present):
        fields.append(f'"a": {draw(leaves)}')
    if draw(present):
        fields.append(f'"b": {{"c": {draw(leaves)}}}')
    if draw(present):
        fields.append(f'"l": [{", ".join(draw(st.lists(leaves, max_size=3)))}]')
    if draw(present):
        fields.append(f'"a/b": {draw(leaves)}')
    return "{" + ", ".join(fields) + "}"


@st.composite
def conditions(draw: st.DrawFn) -> dict[str, Any]:
    op = draw(st.sampled_from(["eq", "ne", "lt", "lte", "gt", "gte", "in", "exists", "prefix"]))
    if op == "exists":
        value = draw(st.sampled_from(["true", "false"]))
    elif op == "prefix":
        value = draw(st.sampled_from(['""', '"a"', '"a\\u0000"', '"\\u00e9"', '"1"']))
    elif op == "in":
        value = "[" + ", ".join(draw(st.lists(leaves, max_size=4))) + "]"
    elif op in ("lt", "lte", "gt", "gte"):
        value = draw(st.one_of(numbers, st.sampled_from(NUMBERS), st.sampled_from(STRINGS)))
    else:
        value = draw(leaves)
    return {"pointer": draw(st.sampled_from(POINTERS)), "op": op, "value": value}


entries = st.lists(documents(), min_size=8, max_size=30)
wheres = st.lists(conditions(), min_size=1, max_size=3)
# Derandomized: the same examples every run, whose density was checked when they were
# chosen (most queries match some entries, so the comparisons prove something); a random
# draw's density varied from run to run, and a guard test on it failed a CI run.
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


async def fill(store: StateStore, docs: list[str]) -> str:
    scope = f"q-{uuid.uuid4().hex[:8]}"
    for n, doc in enumerate(docs):
        await put(store, scope, f"k{n:03}", doc)
    return scope


async def agree(store: StateStore, scope: str, where: list[dict[str, Any]], limit: int,
                indexed: bool) -> None:
    got, used = await query_all(store, scope, where, limit)
    assert got == await reference(store, scope, where), where
    if indexed and any(w["op"] == "eq" and w["value"] in SCALARS for w in where):
        assert used, f"an eq on an indexed pointer walked the keys: {where}"


@SETTINGS
@given(docs=entries, where=wheres, limit=st.integers(1, 7))
async def test_query_equals_reference(store: StateStore, docs: list[str],
                                      where: list[dict[str, Any]], limit: int) -> None:
    scope = await fill(store, docs)
    await agree(store, scope, where, limit, indexed=False)


@SETTINGS
@given(docs=entries, where=wheres, limit=st.integers(1, 7),
       changes=st.lists(st.tuples(st.integers(0, 30), st.one_of(st.none(), documents()),
                                  st.integers(0, 3).map(lambda n: n == 0)), max_size=10))
async def test_indexed_query_equals_reference(
        store: StateStore, docs: list[str], where: list[dict[str, Any]], limit: int,
        changes: list[tuple[int, str | None, bool]]) -> None:
    scope = await fill(store, docs)
    for pointer in {w["pointer"] for w in where}:
        created = await store.call("state::create-index", {"scope": scope, "pointer": pointer})
        assert created == {"created": True, "building": False}
    await agree(store, scope, where, limit, indexed=True)
    expiring = set()
    for n, doc, expires in changes:  # updates, new keys, deletes and expiries under the index
        if doc is None:
            await store.call_json("state::delete", msgspec.json.encode(
                {"scope": scope, "key": f"k{n:03}"}))  # (old values may be 1e400: as text)
            expiring.discard(n)
        else:
            await put(store, scope, f"k{n:03}", doc, **({"ttl_ms": 1} if expires else {}))
            (expiring.add if expires else expiring.discard)(n)
    with anyio.fail_after(10):
        for n in expiring:
            while await store.call_json("state::get", msgspec.json.encode(
                    {"scope": scope, "key": f"k{n:03}"})) != b"null":
                await anyio.sleep(0.002)
    await agree(store, scope, where, limit, indexed=True)  # (expired: met, or reaped already)
    await store.reap_expired()
    for pointer in {w["pointer"] for w in where}:
        assert await index_members(store, scope, pointer) == await expected_members(
            store, scope, pointer)


async def index_members(store: StateStore, scope: str, pointer: str) -> list[bytes]:
    """The members the write scripts keep in the index of `pointer`."""
    name = store.state.keys.for_scope(scope).value_index(scope, pointer)
    return list(await store.state.conn.execute("ZRANGE", name, 0, -1))


async def expected_members(store: StateStore, scope: str, pointer: str) -> list[bytes]:
    """What the index must hold: Python's encoding of each entry's value at `pointer`."""
    parts = predicates.pointer_parts(pointer, "pointer")
    members = []
    for key, text in await reference(store, scope, []):
        found = predicates.resolve(predicates.decode(text), parts)
        encoded = None if found is predicates.MISSING else predicates.encode(found)
        if isinstance(found, predicates.Number) and encoded is None:
            encoded = predicates.ODD
        if encoded is not None:
            members.append(encoded + key.encode())
    return sorted(members)
