"""`state::query` and its indexes, case by case: the refusals (each naming its field and
limit), exact comparison, missing pointers, bounded pages, expiry under an index, a build in
several calls, drop-index, and a scope without indexes writing nothing more."""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateStore, specs
from stateworker.app.cli import status
from stateworker.errors import InvalidRequest
from stateworker.schemas import QueryRequest, WhereItem
from stateworker.state.query import indexes, predicates, query
from tests.calls import error_of
from tests.querymodel import put, query_all, reference
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def q(scope: str, *where: tuple[str, str, Any], **more: Any) -> dict[str, Any]:
    return {"scope": scope, "where": [{"pointer": p, "op": o, "value": v} for p, o, v in where],
            **more}


async def keys_of(store: StateStore, body: dict[str, Any]) -> list[str]:
    return [e["key"] for e in (await store.call("state::query", body))["entries"]]


BAD: list[tuple[dict[str, Any], str, str]] = [
    # (the request's where / fields, details.path, a part of the message)
    ({"where": [{"pointer": "a", "op": "eq", "value": 1}]}, "$.where[0].pointer",
     "not an RFC 6901 JSON pointer"),
    ({"where": [{"pointer": "/a", "op": "eq", "value": 1}, {"pointer": "/a", "op": "like",
                                                            "value": 1}]},
     "$.where[1].op", 'unknown op "like"'),
    ({"where": [{"pointer": "/a", "op": "in", "value": 1}]}, "$.where[0].value",
     "op in takes a list"),
    ({"where": [{"pointer": "/a", "op": "in", "value": list(range(101))}]}, "$.where[0].value",
     "at most 100 values"),
    ({"where": [{"pointer": "/a", "op": "lt", "value": True}]}, "$.where[0].value",
     "op lt takes a number or string"),
    ({"where": [{"pointer": "/a", "op": "gte", "value": [1]}]}, "$.where[0].value",
     "op gte takes a number or string"),
    ({"where": [{"pointer": "/a", "op": "prefix", "value": 1}]}, "$.where[0].value",
     "op prefix takes a string"),
    ({"where": [{"pointer": "/a", "op": "exists", "value": "yes"}]}, "$.where[0].value",
     "op exists takes a boolean"),
    ({"where": [{"pointer": "/a", "op": "eq"}]}, "$.where[0].value", "`value` is required"),
    ({"where": [{"pointer": "/a", "op": "exists", "value": True}] * 17}, "$.where",
     "1 to 16 conditions, got 17"),
    ({"where": []}, "$.where", "1 to 16 conditions, got 0"),
    ({"where": [{"pointer": "/" + "a" * 1024, "op": "exists", "value": True}]},
     "$.where[0].pointer", "at most 1024 bytes"),
    ({"after": "zzz"}, "$.after", "not a cursor returned by state::query"),
    ({"limit": 0}, "$.limit", "between 1 and 1000"),
    ({"limit": 1001}, "$.limit", "between 1 and 1000"),
    ({"order_by": "topic"}, "$.order_by", ""),
]


@pytest.mark.parametrize(("fields", "path", "text"), BAD)
async def test_refusals_name_the_field(store: StateStore, scope: str, fields: dict[str, Any],
                                       path: str, text: str) -> None:
    body = {"scope": scope, "where": [{"pointer": "/a", "op": "exists", "value": True}], **fields}
    err = await error_of(store, "state::query", body)
    assert err.code == "INVALID_REQUEST", err
    assert err.details["path"] == path and text in err.message and path in err.message, err


@pytest.mark.parametrize(("where", "path", "text"), [
    ('{"pointer": "/a", "op": "prefix", "value": "\\ud800"}', "$.where[0].value", "surrogate"),
    ('{"pointer": "/a", "op": "in", "value": ["x", "\\udc00"]}', "$.where[0].value[1]",
     "surrogate"),
    ('{"pointer": "/\\ud800", "op": "exists", "value": true}', "$.where[0].pointer",
     "surrogate"),
])
async def test_lone_surrogates_are_refused(store: StateStore, where: str, path: str,
                                           text: str) -> None:
    body = f'{{"scope": "s", "where": [{where}]}}'.encode()
    err = await error_of(store, "state::query", body)
    assert err.code == "INVALID_REQUEST" and err.details["path"] == path, err
    assert text in err.message, err


async def test_other_refusals(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1})
    listed = await store.call("state::list-entries", {"scope": scope, "limit": 1,
                                                      "order_by": "updated_at"})
    await store.call("state::set", {"scope": scope, "key": "l", "value": 1})
    listed = await store.call("state::list-entries", {"scope": scope, "limit": 1,
                                                      "order_by": "updated_at"})
    err = await error_of(store, "state::query", q(scope, ("", "eq", 1),
                                                  after=listed["next_after"]))
    assert err.code == "INVALID_REQUEST" and err.details["path"] == "$.after"
    err = await error_of(store, "state::query", {**q(scope, ("", "eq", 1)), "wher": []})
    assert err.code == "UNKNOWN_FIELD"
    err = await error_of(store, "state::query", q("state_indexes", ("", "eq", 1)))
    assert err.code == "RESERVED_SCOPE"
    for fn in ("state::create-index", "state::drop-index"):
        err = await error_of(store, fn, {"scope": scope, "pointer": "x"})
        assert err.code == "INVALID_REQUEST" and err.details["path"] == "$.pointer", err
        err = await error_of(store, fn, b'{"scope": "s", "pointer": "/\\ud800"}')
        assert err.code == "INVALID_REQUEST" and err.details["path"] == "$.pointer", err
        err = await error_of(store, fn, {"scope": "state_indexes", "pointer": "/x"})
        assert err.code == "RESERVED_SCOPE"
    for n in range(indexes.MAX_INDEXES):
        await store.call("state::create-index", {"scope": scope, "pointer": f"/p{n}"})
    err = await error_of(store, "state::create-index", {"scope": scope, "pointer": "/more"})
    assert err.code == "INVALID_REQUEST" and err.details == {"path": "$.pointer", "limit": 16}
    assert "16 indexes" in err.message
    again = await store.call("state::create-index", {"scope": scope, "pointer": "/p0"})
    assert again == {"created": False, "building": False}


EXACT: list[tuple[str, str, str, bool]] = [
    # (stored value of /a, op, query value, matches)
    ("1.10", "eq", "1.1", True), ("1", "eq", "1.0", True), ("1", "eq", "1e0", True),
    ("-0", "eq", "0", True), ("0.0", "eq", "-0", True), ("1", "eq", "true", False),
    ("0", "eq", "false", False), ("null", "eq", "false", False),
    ("9007199254740993", "eq", "9007199254740992", False),
    ("9007199254740993", "gt", "9007199254740992", True),
    ("123456789012345678901234567891", "gt", "123456789012345678901234567890", True),
    ("0.10000000000000001", "gt", "0.1", True), ("1e400", "gt", "1e399", True),
    ("-1e400", "lt", "-1e399", True), ("1e-400", "gt", "0", True), ("1E+2", "eq", "100", True),
    ("1e1000000000000000000", "gt", "1e999999999999999999", True),
    ("1e1000000000000000000", "eq", "1e1000000000000000000", True),
    ('"z"', "lt", '"\\u00e9"', True), ('"a"', "lt", '"b"', True), ('"B"', "lt", '"a"', True),
    ('"a"', "lt", "1", False), ("1", "lt", '"a"', False), ("true", "gt", "0", False),
    ('"abc"', "prefix", '"ab"', True), ('"abc"', "prefix", '"abc"', True),
    ("[1]", "prefix", '"["', False), ('{"x":1,"y":2}', "eq", '{"y":2.0,"x":1}', True),
    ("[1,2]", "eq", "[2,1]", False), ("[1.0,{}]", "in", "[[1,{}],2]", True),
    ("5", "in", "[]", False), ("5", "ne", "5.0", False), ("5", "ne", '"5"', True),
]


@pytest.mark.parametrize("indexed", [False, True])
async def test_exact_comparison(store: StateStore, scope: str, indexed: bool) -> None:
    """Each row in a scope of its own, beside a few other numbers and strings."""
    for n, (stored, op, value, match) in enumerate(EXACT):
        row = f"{scope}-{n}"
        for k, other in enumerate(["0", "2", '"m"', "null", "1e3"]):
            await put(store, row, f"o{k}", f'{{"a": {other}}}')
        await put(store, row, "k", f'{{"a": {stored}}}')
        if indexed:
            await store.call("state::create-index", {"scope": row, "pointer": "/a"})
        where = [{"pointer": "/a", "op": op, "value": value}]
        got, used = await query_all(store, row, where)
        assert ("k" in [k for k, _ in got]) is match, (stored, op, value)
        from_index = (op in ("eq", "lt", "gt", "prefix") and value[0] not in "[{") or \
            (op == "in" and "{" not in value)  # (containers are not indexed)
        if indexed and from_index and len(value) < 20:  # (nor a 19-digit exponent)
            assert used == {"/a"}, (stored, op, value)
        if not any("e1" in text and len(text) > 20 for text in (stored, value)):
            # (Fractions cannot hold 1e(10^18): for those the column above is the reference)
            assert got == await reference(store, row, where), (stored, op, value)


async def test_missing_pointers(store: StateStore, scope: str) -> None:
    for key, value in [("obj", {"a": 1}), ("none", {}), ("str", "abc"), ("arr", [5, 6]),
                       ("nul", {"a": None})]:
        await store.call("state::set", {"scope": scope, "key": key, "value": value})
    # A missing pointer matches only exists: false -- `ne` included (not "a different value").
    assert await keys_of(store, q(scope, ("/a", "ne", 2))) == ["nul", "obj"]
    assert await keys_of(store, q(scope, ("/a", "exists", False))) == ["arr", "none", "str"]
    assert await keys_of(store, q(scope, ("/a", "exists", True))) == ["nul", "obj"]
    assert await keys_of(store, q(scope, ("/a", "eq", None))) == ["nul"]
    # Array steps: "0" or no leading zero, inside the array; a string is not an array.
    assert await keys_of(store, q(scope, ("/1", "eq", 6))) == ["arr"]
    assert await keys_of(store, q(scope, ("/01", "exists", True))) == []
    assert await keys_of(store, q(scope, ("/-", "exists", True))) == []
    assert await keys_of(store, q(scope, ("/0", "exists", True))) == ["arr"]
    assert await keys_of(store, q(scope, ("", "prefix", "ab"))) == ["str"]
    both = q(scope, ("/a", "exists", True), ("/a", "ne", None))
    assert await keys_of(store, both) == ["obj"]


async def test_pages_are_bounded_and_resume(store: StateStore, scope: str) -> None:
    """2,500 entries and one match at the end: pages of EXAMINE entries examined, each
    returning a cursor even when it found nothing."""
    assert query.EXAMINE == 1000
    for n in range(2500):
        await store.call("state::set", {"scope": scope, "key": f"k{n:05}",
                                        "value": {"n": n}})
    pages = []
    body = q(scope, ("/n", "gte", 2499))
    while True:
        page = await store.call("state::query", body)
        pages.append(page)
        if "next_after" not in page:
            break
        body["after"] = page["next_after"]
    assert [len(p["entries"]) for p in pages] == [0, 0, 1]
    assert query.decode_after(pages[0]["next_after"], "key") == (b"k00999", "")
    assert query.decode_after(pages[1]["next_after"], "key") == (b"k01999", "")
    # a full page stops at its last match; the next resumes after it
    first = await store.call("state::query", q(scope, ("/n", "lt", 10), limit=4))
    assert [e["key"] for e in first["entries"]] == ["k00000", "k00001", "k00002", "k00003"]
    assert first["entries"][0] == {**first["entries"][0], "value": {"n": 0}, "version": 1}
    assert query.decode_after(first["next_after"], "key") == (b"k00003", "")


async def test_expiry_under_an_index(redis_server: RedisServer, prefix: str, scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:  # (reaped below, when the test says)
        await expiry_under_an_index(store, scope)


async def expiry_under_an_index(store: StateStore, scope: str) -> None:
    await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    for n in range(6):
        await store.call("state::set", {"scope": scope, "key": f"k{n}", "value": {"v": n % 2},
                                        **({"ttl_ms": 1} if n < 3 else {})})
    where = [{"pointer": "/v", "op": "eq", "value": "1"}]

    async def gone() -> bool:
        return await store.call("state::get", {"scope": scope, "key": "k2"}) is None

    await until_async(gone)
    got, used = await query_all(store, scope, where)
    assert [k for k, _ in got] == ["k3", "k5"] and used == {"/v"}
    assert got == await reference(store, scope, where)
    name = store.state.keys.for_scope(scope).value_index(scope, "/v")
    assert await store.state.conn.execute("ZCARD", name) == 6  # (expired, not reaped yet)
    await store.reap_expired()
    assert await store.state.conn.execute("ZCARD", name) == 3
    assert (await query_all(store, scope, where))[0] == got


async def until_async(condition: Any, timeout_s: float = 10) -> None:
    """Poll `condition()` until true, failing after `timeout_s`."""
    with anyio.fail_after(timeout_s):
        while not await condition():
            await anyio.sleep(0.005)


async def test_a_build_over_several_calls(store: StateStore, scope: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexes, "BATCHES_PER_CALL", 1)
    for n in range(2300):
        await store.call("state::set", {"scope": scope, "key": f"k{n:05}",
                                        "value": {"v": n % 100}})
    created = await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    assert created == {"created": True, "building": True}
    assert await store.call("state::list-indexes", {"scope": scope}) == {"indexes": [
        {"pointer": "/v", "state": "building", "indexed": 1000, "total": 2300}]}
    report = await status.status_report(store.state.settings)
    assert report["indexes_building"] == [
        {"scope": scope, "pointer": "/v", "indexed": 1000, "total": 2300}]
    assert f"indexing   {scope} /v: 1000/2300 keys" in status.summary(report)
    where = [{"pointer": "/v", "op": "eq", "value": "7"}]
    got, used = await query_all(store, scope, where)  # not ready: the keys are walked
    assert used == set() and len(got) == 23
    # a write during the build is indexed by the write itself
    await store.call("state::set", {"scope": scope, "key": "k02299", "value": {"v": 7}})
    assert await store.call("state::create-index", {"scope": scope, "pointer": "/v"}) == {
        "created": False, "building": True}
    assert await store.call("state::create-index", {"scope": scope, "pointer": "/v"}) == {
        "created": False, "building": False}
    assert await store.call("state::list-indexes", {"scope": scope}) == {"indexes": [
        {"pointer": "/v", "state": "ready", "indexed": 2300, "total": 2300}]}
    assert (await status.status_report(store.state.settings))["indexes_building"] == []
    got, used = await query_all(store, scope, where)
    assert used == {"/v"} and len(got) == 24 and got == await reference(store, scope, where)


async def test_ranges_use_the_index_up_to_their_candidates(store: StateStore,
                                                           scope: str) -> None:
    for n in range(1200):
        await store.call("state::set", {"scope": scope, "key": f"k{n:05}", "value": {"v": n}})
    await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    small = [{"pointer": "/v", "op": "gte", "value": "1190"}]
    got, used = await query_all(store, scope, small, limit=3)
    assert used == {"/v"} and [k for k, _ in got] == [f"k{n:05}" for n in range(1190, 1200)]
    large = [{"pointer": "/v", "op": "gte", "value": "100"}]  # over CANDIDATES: the keys
    got, used = await query_all(store, scope, large, limit=1000)
    assert used == set() and len(got) == 1100 and got == await reference(store, scope, large)


async def test_drop_index(store: StateStore, scope: str) -> None:
    for n in range(5):
        await store.call("state::set", {"scope": scope, "key": f"k{n}", "value": {"v": n}})
    await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    assert await store.call("state::drop-index", {"scope": scope, "pointer": "/v"}) == {
        "dropped": True}
    assert await store.call("state::drop-index", {"scope": scope, "pointer": "/v"}) == {
        "dropped": False}
    part = store.state.keys.for_scope(scope)
    assert await store.state.conn.execute("EXISTS", part.value_index(scope, "/v"),
                                          part.index_defs(scope)) == 0
    assert await store.call("state::list-indexes", {"scope": scope}) == {"indexes": []}
    got, used = await query_all(store, scope, [{"pointer": "/v", "op": "eq", "value": "3"}])
    assert used == set() and [k for k, _ in got] == ["k3"]
    await store.call("state::set", {"scope": scope, "key": "k9", "value": {"v": 3}})
    assert await store.state.conn.execute("EXISTS", part.value_index(scope, "/v")) == 0


async def test_a_scope_without_indexes_gets_no_index_keys(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": {"v": 1}})
    await store.call("state::update", {"scope": scope, "key": "k", "ops": [
        {"type": "increment", "path": "v", "by": 1}]})
    await store.call("state::delete", {"scope": scope, "key": "k"})
    names = await store.state.conn.execute("KEYS", f"{store.state.settings.prefix}:*i[xv]:*")
    assert names == []


async def test_update_keeps_the_index(store: StateStore, scope: str) -> None:
    await store.call("state::create-index", {"scope": scope, "pointer": "/s/t"})
    await store.call("state::set", {"scope": scope, "key": "k", "value": {"s": {"t": "a\"\u00e9"}}})
    await store.call("state::update", {"scope": scope, "key": "k", "ops": [
        {"type": "append", "path": ["s", "t"], "value": "\u0000x"}]})
    got = await keys_of(store, q(scope, ("/s/t", "eq", "a\"\u00e9\u0000x")))
    assert got == ["k"]
    name = store.state.keys.for_scope(scope).value_index(scope, "/s/t")
    members = await store.state.conn.execute("ZRANGE", name, 0, -1)
    assert members == [predicates.encode("a\"\u00e9\u0000x") + b"k"]
    assert json.loads(msgspec.json.encode(await store.call(
        "state::query", q(scope, ("/s/t", "prefix", "a\"")))))["index"] == "/s/t"


async def test_an_indexed_eq_pages_through_many_matches(store: StateStore, scope: str) -> None:
    """More matches than a page examines: each page walks the value's range from the cursor."""
    await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    for n in range(2100):
        await store.call("state::set", {"scope": scope, "key": f"k{n:05}", "value": {"v": n % 2}})
    where = [{"pointer": "/v", "op": "in", "value": "[0, 7]"}]
    pages = []
    after = None
    while True:
        body = q(scope, ("/v", "in", [0, 7]), limit=1000, **({"after": after} if after else {}))
        page = await store.call("state::query", body)
        pages.append([e["key"] for e in page["entries"]])
        assert page["index"] == "/v"
        after = page.get("next_after")
        if after is None:
            break
    assert [len(keys) for keys in pages] == [1000, 50]
    got, used = await query_all(store, scope, where, limit=333)
    assert [k for k, _ in got] == [f"k{n:05}" for n in range(0, 2100, 2)] == pages[0] + pages[1]
    assert used == {"/v"}


async def test_a_page_of_expired_entries_still_resumes(redis_server: RedisServer, prefix: str,
                                                      scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:  # (expired entries stay till the end)
        await expired_page(store, scope)


async def expired_page(store: StateStore, scope: str) -> None:
    for n in range(1001):
        await store.call("state::set", {"scope": scope, "key": f"a{n:04}", "value": 1,
                                        "ttl_ms": 1})
    await store.call("state::set", {"scope": scope, "key": "z", "value": 1})

    async def expired() -> bool:
        return await store.call("state::get", {"scope": scope, "key": "a1000"}) is None

    await until_async(expired)
    first = await store.call("state::query", q(scope, ("", "eq", 1)))
    assert first["entries"] == []
    assert query.decode_after(first["next_after"], "key") == (b"a0999", "")
    got, _ = await query_all(store, scope, [{"pointer": "", "op": "eq", "value": "1"}])
    assert [k for k, _ in got] == ["z"]


async def test_typed_methods_over_the_bus(client: Any, store: StateStore, scope: str) -> None:
    """StateClient (over the bus, call ids bound) and StateStore: the generated methods."""
    for face in (client, store):
        await face.set(scope, "a", {"v": 1.0})
        await face.set(scope, "b", {"v": 2})
        assert await face.create_index(scope, "/v") in ({"created": True, "building": False},
                                                        {"created": False, "building": False})
        page = await face.query(scope, [{"pointer": "/v", "op": "eq", "value": 1}])
        assert [e["key"] for e in page["entries"]] == ["a"] and page["index"] == "/v"
        assert await face.list_indexes(scope) == [
            {"pointer": "/v", "state": "ready", "indexed": 2, "total": 2}]
    assert await client.drop_index(scope, "/v") == {"dropped": True}
    assert await store.list_indexes(scope) == []


async def test_a_typed_request_with_a_lone_surrogate_is_refused(store: StateStore) -> None:
    """StateStore.typed skips the body's decoding (and its check): the query's own holds."""
    request = QueryRequest(scope="s", where=[WhereItem("/a", "prefix", msgspec.Raw(b'"\\ud800"'))])
    with pytest.raises(InvalidRequest) as caught:
        await store.typed(specs.QUERY, request)
    assert caught.value.details["path"] == "$.where[0].value"


async def test_transactions_and_bulk_calls_keep_the_index(store: StateStore, scope: str) -> None:
    """Every multi-key write path goes through entry_write / entry_unlink too."""
    await store.call("state::create-index", {"scope": scope, "pointer": "/v"})
    await store.call("state::set-many", {"scope": scope, "entries": [
        {"key": f"k{n}", "value": {"v": n % 3}} for n in range(9)]})
    await store.call("state::transaction", {"scope": scope, "ops": [
        {"op": "set", "key": "k0", "value": {"v": 2}},
        {"op": "update", "key": "k1", "ops": [{"type": "increment", "path": "v", "by": 1}]},
        {"op": "delete", "key": "k2"},
        {"op": "set", "key": "p1", "value": {"v": 1}}]})
    await store.call("state::delete-many", {"scope": scope, "entries": [{"key": "k3"}]})
    await store.call("state::delete-by-prefix", {"scope": scope, "prefix": "k8"})
    name = store.state.keys.for_scope(scope).value_index(scope, "/v")
    expected = sorted(predicates.encode(predicates.Number(str(v))) + k.encode() for k, v in [
        ("k0", 2), ("k1", 2), ("k4", 1), ("k5", 2), ("k6", 0), ("k7", 1), ("p1", 1)])
    assert await store.state.conn.execute("ZRANGE", name, 0, -1) == expected
    for value in ("0", "1", "2"):
        where = [{"pointer": "/v", "op": "eq", "value": value}]
        got, used = await query_all(store, scope, where)
        assert used == {"/v"} and got == await reference(store, scope, where)


async def test_by_updated_at_pages_in_the_order_list_entries_gives(store: StateStore,
                                                                   scope: str) -> None:
    """`order_by: updated_at`: the matches in the updated index's order (ties by key), paged
    with small limits through keys rewritten out of key order, an index on the pointer or
    not; a key-order cursor is refused there."""
    for n in (5, 3, 9, 1, 7, 2, 8, 0, 6, 4):
        await store.set(scope, f"k{n}", {"n": n})
    await store.set(scope, "k3", {"n": 13})  # (now the most recently updated)
    listed = await store.call("state::list-entries", {"scope": scope, "order_by": "updated_at",
                                                      "include_values": True})
    wanted = [e["key"] for e in listed["entries"] if e["value"]["n"] % 2 == 1]
    for indexed in (False, True):
        if indexed:
            await store.call("state::create-index", {"scope": scope, "pointer": "/n"})
        got: list[str] = []
        after = None
        for _ in range(20):
            body = q(scope, ("/n", "gte", 1), order_by="updated_at", limit=2)
            page = await store.call("state::query", body if after is None else
                                    {**body, "after": after})
            got += [e["key"] for e in page["entries"] if e["value"]["n"] % 2 == 1]
            after = page.get("next_after")
            if after is None:
                break
        assert got == wanted, indexed
    key_order = await store.call("state::query", q(scope, ("/n", "gte", 0), limit=1))
    err = await error_of(store, "state::query", q(scope, ("/n", "gte", 0), order_by="updated_at",
                                                  after=key_order["next_after"]))
    assert err.details["path"] == "$.after" and "order_by updated_at" in err.message
    forged = base64.urlsafe_b64encode(json.dumps(["updated_at", "asc", "YQ==", "\u0663", 0])
                                      .encode()).decode().rstrip("=")  # an Arabic-Indic 3
    err = await error_of(store, "state::query", q(scope, ("/n", "gte", 0), order_by="updated_at",
                                                  after=forged))
    assert err.code == "INVALID_REQUEST" and err.details["path"] == "$.after", err


@pytest.mark.parametrize("indexed", [False, True])
async def test_a_page_stops_once_its_values_reach_the_call_byte_budget(
        redis_server: RedisServer, prefix: str, scope: str, indexed: bool) -> None:
    """Ten values of 60,000 bytes of numbers, max_call_bytes 256 KiB: a page examines values
    until their bytes reach the budget (the fifth), returns `next_after` even with no match,
    and the next page goes on; by the key walk and by an index alike. The numbers at the
    pointer still compare exactly (`1.0` is `1`)."""
    budget = 256 * 1024
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=64 * 1024, max_call_bytes=budget) as store:
        pad = ",".join(["1"] * 29_990)
        for n in range(10):
            text = f'{{"n":{n}.0,"pad":[{pad}]}}'
            text = text[:-2] + "1" * (60_000 - len(text)) + "]}"  # (the last number longer)
            assert len(text) == 60_000
            await put(store, scope, f"k{n}", text)
        if indexed:
            await store.call("state::create-index", {"scope": scope, "pointer": "/n"})
        body = q(scope, ("/n", "gte", 0), ("/n", "gte", 8))  # (the index: every entry)
        pages = []
        while True:
            page = await store.call("state::query", body)
            assert page.get("index") == ("/n" if indexed else None)
            pages.append(page)
            if "next_after" not in page:
                break
            body["after"] = page["next_after"]
        keys = [[e["key"] for e in p["entries"]] for p in pages]
        # (a walk stopped at the last entry still gives a cursor: one more, empty page)
        assert keys in ([[], ["k8", "k9"]], [[], ["k8", "k9"], []])
        assert query.decode_after(pages[0]["next_after"], "key") == (b"k4", "")
        assert pages[1]["entries"][0]["value"]["n"] == 8


@pytest.mark.parametrize("indexed", [False, True])
async def test_a_page_examines_fewer_entries_when_its_conditions_take_many_steps(
        store: StateStore, scope: str, indexed: bool) -> None:
    """A condition is compared with each entry node by node, in the service's loop: an `eq`
    of a 1,001-int list over a page of 1,000 such entries held it 3 s. A page spends at most
    MAX_WORK steps: here 105 an entry (1; /n's step and value; /l's step and its 101 nodes),
    190 entries a page, by the key walk and by the index of /n alike."""
    listed = [1] * 99 + [2]
    for start in range(0, 300, 100):
        await store.call("state::set-many", {"scope": scope, "entries": [
            {"key": f"k{n:03d}", "value": {"n": 1, "l": listed}}
            for n in range(start, start + 100)]})
    if indexed:
        await store.call("state::create-index", {"scope": scope, "pointer": "/n"})
    body = q(scope, ("/n", "eq", 1), ("/l", "eq", listed), limit=1000)
    steps = predicates.work(predicates.parse_where([
        WhereItem(where["pointer"], where["op"], msgspec.Raw(json.dumps(where["value"]).encode()))
        for where in body["where"]]))
    assert steps == 105
    first = await store.call("state::query", body)
    assert first.get("index") == ("/n" if indexed else None)
    assert len(first["entries"]) == predicates.MAX_WORK // steps == 190
    rest = await store.call("state::query", {**body, "after": first["next_after"]})
    assert [e["key"] for e in first["entries"] + rest["entries"]] == [
        f"k{n:03d}" for n in range(300)]


async def test_conditions_past_the_work_limit_are_refused_before_they_are_decoded(
        store: StateStore, scope: str) -> None:
    """One entry's conditions take at most MAX_WORK steps (a page examines one entry at
    least): an `eq` of a list of 450,000 ints was read (0.96 s of the loop making each a
    Number) and then compared with every entry. Counted in C first, refused by the item that
    passes the limit, nothing read from Redis."""
    await store.set(scope, "k", 1)
    err = await error_of(store, "state::query", q(scope, ("/a", "eq", list(range(450_000)))))
    assert err.code == "INVALID_REQUEST"
    assert err.details == {"path": "$.where", "limit": predicates.MAX_WORK}
    assert "$.where[0]" in err.message and str(predicates.MAX_WORK) in err.message
    lists = [list(range(100))] * 100  # (an `in` of 100 lists of 100: 10,103 steps)
    err = await error_of(store, "state::query", q(scope, ("/a", "in", lists), ("/b", "in", lists)))
    assert err.details == {"path": "$.where", "limit": predicates.MAX_WORK}
    assert "$.where[1]" in err.message
    assert await keys_of(store, q(scope, ("/a", "in", lists), ("", "eq", 1))) == []
    err = await error_of(store, "state::query", {"scope": scope, "where": [
        {"pointer": "", "op": "gt", "value": msgspec.Raw(b"1" * 4301)}]})
    assert err.code == "INVALID_REQUEST"
    assert err.details == {"path": "$.where[0].value", "limit": 4300}


async def test_a_page_counts_numbers_that_are_not_integers_in_its_byte_budget(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """Each number that is not an integer is an object made when a value is decoded (a page
    of 8 MiB of `1e1` held the loop 1.3 s): it counts NUMBER_TEXT_BYTES more in the page's
    byte budget. Values of 30,000 bytes, 7,499 `1e1` each, max_call_bytes 256 KiB: a page
    examines two, where values of as many bytes of integers fill nine."""
    budget = 256 * 1024
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=64 * 1024, max_call_bytes=budget) as small:
        for n in range(10):
            await put(small, scope, f"d{n}", "[" + ",".join(["1e1"] * 7499) + "]")
            await put(small, scope, f"i{n}", "[" + ",".join(["11"] * 10_000) + "]")
        for first, examined in (("d", ["d0", "d1"]), ("i", [f"i{n}" for n in range(9)])):
            page = await small.call("state::query", q(scope, ("", "ne", 0), limit=1000,
                                                      **({"after": query.encode_after(
                                                          b"d9")} if first == "i" else {})))
            assert [e["key"] for e in page["entries"]] == examined
