"""state::update (update.lua): every op rule and error code, each with the exact value and
errors list; the expiry an update sets and keeps."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateError, StateStore
from stateworker.clock import now_ms
from stateworker.error_codes import ERRORS_DOC_URL, doc_url
from stateworker.state.kv.ops import OP_CODES
from tests.jsontext import exact_load
from tests.lua.ttl import HOUR_MS, pass_time, stored_expiry
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def update(store: StateStore, scope: str, ops: list[dict[str, Any]],
                 start: Any = "missing", key: str = "k") -> dict[str, Any]:
    if start != "missing":
        await store.call("state::set", {"scope": scope, "key": key, "value": start})
    return dict(await store.call("state::update", {"scope": scope, "key": key, "ops": ops}))


def err(index: int, code: str, message: str) -> dict[str, Any]:
    return {"op_index": index, "code": code, "message": message, "doc_url": doc_url(code)}


async def test_mixed_batch_three_failures_and_one_applied(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "increment", "path": "name", "by": 1},
        {"type": "set", "path": "__proto__", "value": 1},
        {"type": "append", "path": "count", "value": [1]},
        {"type": "set", "path": "ok", "value": True},
    ], start={"name": "x", "count": "c"})
    assert result["new_value"] == {"name": "x", "count": "c", "ok": True}
    assert result["old_value"] == {"name": "x", "count": "c"}
    assert result["errors"] == [
        err(0, "increment.not_number", "Expected number at path 'name', got string."),
        err(1, "set.path.proto_polluted",
            "Path segment '__proto__' is not allowed (prototype pollution)."),
        err(2, "append.type_mismatch", "Expected string append value at path 'count', got array."),
    ]
    assert [e.type for e in await store.events(scope)] == ["state:created", "state:updated"]


async def test_33_segment_path_is_too_deep(store: StateStore, scope: str) -> None:
    path = [f"s{i}" for i in range(33)]
    result = await update(store, scope, [
        {"type": "merge", "path": path, "value": {"a": 1}},
        {"type": "append", "path": path, "value": 1},
        {"type": "merge", "path": path[:32], "value": {"a": 1}},
    ], start={})
    assert result["errors"] == [
        err(0, "merge.path.too_deep", "Path depth 33 exceeds maximum of 32"),
        err(1, "append.path.too_deep", "Path depth 33 exceeds maximum of 32"),
    ]
    node = result["new_value"]
    for segment in path[:32]:
        node = node[segment]
    assert node == {"a": 1}


async def test_nested_append_replaces_array_intermediate(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [{"type": "append", "path": ["a", "b"], "value": 42}],
                          start={"a": [1, 2, 3]})
    assert result["new_value"] == {"a": {"b": [42]}}
    assert "errors" not in result


async def test_root_increment_and_append_on_missing_key(store: StateStore, scope: str) -> None:
    assert (await update(store, scope, [{"type": "increment", "path": "", "by": 5}],
                         key="i"))["new_value"] == 5
    assert (await update(store, scope, [{"type": "decrement", "path": "", "by": 5}],
                         key="d"))["new_value"] == -5
    assert (await update(store, scope, [{"type": "append", "value": "hi"}],
                         key="s"))["new_value"] == "hi"
    assert (await update(store, scope, [{"type": "append", "path": [], "value": {"x": 1}}],
                         key="a"))["new_value"] == [{"x": 1}]
    created = await update(store, scope, [{"type": "increment", "path": "", "by": 1}], key="i")
    assert created["new_value"] == 6 and created["old_value"] == 5


async def test_set_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "set", "path": "a.b", "value": 1},
        {"type": "set", "path": "z"},
        {"type": "set", "path": "first", "value": [2]},
    ], start={"first": 1, "m": 0})
    assert exact_load(b"[]") == []
    assert list(result["new_value"].items()) == [("first", [2]), ("m", 0), ("a.b", 1), ("z", None)]
    result = await update(store, scope, [{"type": "set", "path": "x", "value": 1}], start=[1],
                          key="arr")
    assert result["errors"] == [err(0, "set.target_not_object",
                                    "Cannot set at path 'x': target is array, expected object.")]
    assert result["new_value"] == [1]
    result = await update(store, scope, [{"type": "set", "path": "", "value": "root"}], key="r")
    assert result["new_value"] == "root"
    result = await update(store, scope, [{"type": "set", "path": ""}], key="r")
    assert result["new_value"] is None


async def test_remove_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "remove", "path": "a"}, {"type": "remove", "path": "missing"},
    ], start={"a": 1, "b": 2})
    assert result["new_value"] == {"b": 2} and "errors" not in result
    result = await update(store, scope, [{"type": "remove", "path": ""}], key="k")
    assert result["new_value"] is None
    result = await update(store, scope, [{"type": "remove", "path": "x"}], key="k")
    assert result["errors"] == [err(0, "remove.target_not_object",
                                    "Cannot remove at path 'x': target is null, expected object.")]


async def test_merge_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "merge", "value": {"b": 20, "c": 3}},
        {"type": "merge", "path": "n", "value": {"x": 1}},
        {"type": "merge", "path": ["deep", "er"], "value": {"y": 2}},
    ], start={"a": 1, "b": 2, "n": 5, "deep": []})
    assert result["new_value"] == {"a": 1, "b": 20, "n": {"x": 1}, "deep": {"er": {"y": 2}},
                                   "c": 3}
    assert list(result["new_value"]) == ["a", "b", "n", "deep", "c"]
    # root merge into a non-object: an op error, as for every other type mismatch
    for start, kind in ((7, "number"), ([1], "array"), ("s", "string"), (None, "null")):
        result = await update(store, scope, [{"type": "merge", "value": {"a": 1}}],
                              start=start, key=f"m-{kind}")
        assert result["new_value"] == start and result["version"] == 1
        assert result["errors"] == [err(0, "merge.target_not_object",
                                        f"Cannot merge at path 'root': target is {kind}, "
                                        "expected object.")]
    result = await update(store, scope, [{"type": "merge", "value": {"a": 1}}], start=7, key="n")
    # along a path, a non-object root becomes {}
    result = await update(store, scope, [{"type": "merge", "path": "p", "value": {"a": 1}}],
                          key="n")
    assert result["new_value"] == {"p": {"a": 1}}


async def test_merge_value_limits(store: StateStore, scope: str) -> None:
    deep: Any = 1
    for _ in range(17):
        deep = {"d": deep}
    result = await update(store, scope, [
        {"type": "merge", "value": [1]},
        {"type": "merge", "value": {"ok": 1, "constructor": 2}},
        {"type": "merge", "value": {f"k{i}": i for i in range(1025)}},
        {"type": "merge", "value": deep},
        {"type": "merge", "value": deep["d"]},
    ], start={})
    assert result["errors"] == [
        err(0, "merge.value.not_an_object", "Merge value must be a JSON object"),
        err(1, "merge.value.proto_polluted",
            'Merge value top-level key "constructor" is a prototype-pollution sink'),
        err(2, "merge.value.too_many_keys", "Merge value has more than 1024 top-level keys"),
        err(3, "merge.value.too_deep", "Merge value JSON nesting depth exceeds maximum of 16"),
    ]
    assert result["new_value"] == deep["d"]


async def test_increment_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "increment", "path": "n", "by": 2},
        {"type": "decrement", "path": "m", "by": 3},
        {"type": "increment", "path": "f", "by": 1},
        {"type": "increment", "path": "z", "by": 0},
        {"type": "decrement", "path": "s", "by": 1},
    ], start={"n": 1, "f": 1.5, "z": None, "s": "x"})
    assert result["new_value"] == {"n": 3, "f": 2.5, "z": None, "s": "x", "m": -3}
    assert result["errors"] == [
        err(3, "increment.not_number", "Expected number at path 'z', got null."),
        err(4, "decrement.not_number", "Expected number at path 's', got string."),
    ]
    result = await update(store, scope, [{"type": "increment", "path": "a", "by": 1}],
                          start="text", key="t")
    assert result["errors"] == [err(0, "increment.target_not_object",
                                    "Cannot increment at path 'a': target is string, "
                                    "expected object.")]
    result = await update(store, scope, [{"type": "increment", "path": "", "by": 1}],
                          start={"a": 1}, key="o")
    assert result["errors"] == [err(0, "increment.not_number",
                                    "Expected number at path 'root', got object.")]


async def test_increment_range(store: StateStore, scope: str) -> None:
    top = 2**63 - 1
    result = await update(store, scope, [
        {"type": "increment", "path": "a", "by": 1},
        {"type": "decrement", "path": "b", "by": 1},
        {"type": "decrement", "path": "c", "by": -(2**63)},
        {"type": "increment", "path": "d", "by": -(2**63)},
    ], start={"a": top, "b": -(2**63)})
    assert result["errors"] == [
        err(0, "increment.out_of_range",
            "Result of increment at path 'a' is outside the 64-bit signed integer range."),
        err(1, "decrement.out_of_range",
            "Result of decrement at path 'b' is outside the 64-bit signed integer range."),
        err(2, "decrement.out_of_range",
            "Result of decrement at path 'c' is outside the 64-bit signed integer range."),
    ]
    assert result["new_value"] == {"a": top, "b": -(2**63), "d": -(2**63)}


async def test_float_by_fails_the_whole_request(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": {"n": 1}})
    for body, path in [
        ({"ops": [{"type": "set", "path": "x", "value": 1},
                  {"type": "increment", "path": "n", "by": 1.5}]}, "$.ops[1].by"),
        ({"ops": [{"type": "increment", "path": "n", "by": 2**63}]}, "$.ops[0].by"),
        ({"ops": [{"type": "increment", "path": "n"}]}, "$.ops[0].by"),
        ({"ops": [{"type": "explode", "path": "n"}]}, "$.ops[0].type"),
        ({"ops": [{"type": "set", "path": ["a"], "value": 1}]}, "$.ops[0].path"),
        ({"ops": [{"type": "merge", "path": "a"}]}, "$.ops[0].value"),
        ({"ops": {}}, "$.ops"),
    ]:
        with pytest.raises(StateError) as caught:
            await store.call("state::update", {"scope": scope, "key": "k", **body})
        assert caught.value.code == "INVALID_REQUEST"
        assert caught.value.details["path"] == path, caught.value.message
    assert await store.get(scope, "k") == {"n": 1}
    assert len(await store.events(scope)) == 1


async def test_append_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "append", "path": "arr", "value": [9]},
        {"type": "append", "path": "s", "value": "b"},
        {"type": "append", "path": "new", "value": "x"},
        {"type": "append", "path": ["new2"], "value": "x"},
        {"type": "append", "path": "nul", "value": 1},
        {"type": "append", "path": "obj", "value": 1},
        {"type": "append", "path": "num", "value": 1},
    ], start={"arr": [1], "s": "a", "nul": None, "obj": {}, "num": 3})
    assert result["new_value"] == {"arr": [1, [9]], "s": "ab", "nul": [1], "obj": {}, "num": 3,
                                   "new": "x", "new2": ["x"]}
    assert result["errors"] == [
        err(5, "append.type_mismatch", "Cannot append at path 'obj': target is object, "
            "expected array, string, null, or missing field."),
        err(6, "append.type_mismatch", "Cannot append at path 'num': target is number, "
            "expected array, string, null, or missing field."),
    ]
    result = await update(store, scope, [{"type": "append", "path": ["a", "b"], "value": 1}],
                          start=[], key="list")
    assert result["errors"] == [err(0, "append.target_not_object",
                                    "Cannot append at path '[a, b]': target is array, "
                                    "expected object.")]
    result = await update(store, scope, [{"type": "append", "value": 1}], key="list")
    assert result["new_value"] == [1]
    result = await update(store, scope, [{"type": "append", "value": 1}], start="s", key="str")
    assert result["errors"] == [err(0, "append.type_mismatch",
                                    "Expected string append value at path 'root', got number.")]


async def test_path_segment_rules(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "append", "path": ["a", ""], "value": 1},
        {"type": "set", "path": "x" * 257, "value": 1},
        {"type": "remove", "path": "prototype"},
        {"type": "merge", "path": ["ok", "constructor"], "value": {}},
        {"type": "set", "path": "é" * 128, "value": 1},
    ], start={})
    assert result["errors"] == [
        err(0, "append.path.empty_segment", "Path contains an empty or non-string segment"),
        err(1, "set.path.segment_too_long", "Path segment of 257 bytes exceeds maximum of 256"),
        err(2, "remove.path.proto_polluted",
            "Path segment 'prototype' is not allowed (prototype pollution)."),
        err(3, "merge.path.proto_polluted",
            "Path segment 'constructor' is not allowed (prototype pollution)."),
    ]
    assert result["new_value"] == {"é" * 128: 1}


async def test_no_write_when_no_op_applies(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": "text"})
    result = await update(store, scope, [{"type": "set", "path": "a", "value": 1}])
    assert result["old_value"] == result["new_value"] == "text" and result["version"] == 1
    assert len(await store.events(scope)) == 1
    missing = await update(store, scope, [{"type": "increment", "path": "", "by": 1},
                                          {"type": "set", "path": "__proto__"}], key="m")
    # ops on a missing key: the root increment applies, the entry is created
    assert missing["new_value"] == 1
    failing = await update(store, scope, [{"type": "set", "path": "constructor"}], key="m2")
    assert failing["new_value"] == {} and failing["version"] == 1  # missing key: written as {}


async def test_update_keeps_topic_and_expiry_unless_given(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", {"n": 1}, topic="t", ttl_ms=60_000)
    before = await store.get_entry(scope, "k")
    await store.call("state::update", {"scope": scope, "key": "k",
                                       "ops": [{"type": "increment", "path": "n", "by": 1}]})
    after = await store.get_entry(scope, "k")
    assert after.topic == "t" and after.expires_at == before.expires_at and after.version == 2
    await store.call("state::update", {"scope": scope, "key": "k", "topic": None,
                                       "ops": [{"type": "increment", "path": "n", "by": 1}]})
    assert (await store.get_entry(scope, "k")).topic is None
    with pytest.raises(StateError) as caught:
        await store.call("state::update", {"scope": scope, "key": "k", "expected_version": 1,
                                           "ops": [{"type": "remove", "path": "n"}]})
    assert caught.value.code == "CONFLICT"
    assert caught.value.details == {"expected_version": 1, "current_version": 3}


async def test_update_result_too_large_writes_nothing(redis_server: Any, prefix: str,
                                                      scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, max_value_bytes=20) as store:
        await store.set(scope, "k", {"a": "0123456789"})
        with pytest.raises(StateError) as caught:
            await store.call("state::update", {"scope": scope, "key": "k", "ops": [
                {"type": "append", "path": "a", "value": "0123456789"}]})
        assert caught.value.code == "VALUE_TOO_LARGE"
        assert caught.value.details["limit"] == 20 and caught.value.details["size"] == 28
        assert await store.get(scope, "k") == {"a": "0123456789"}


async def test_exactness_of_untouched_values(store: StateStore, scope: str) -> None:
    start = (b'{"big":9007199254740993,"dec":1.2300,"e":1E+2,"arr":[],"obj":{},'
             b'"z":{"y":[{}],"x":-0.0},"u":"\\u00e9\\n<&>","n":0}')
    await store.call_json("state::set", b'{"scope":"%s","key":"k","value":%s}' % (
        scope.encode(), start))
    result = await store.call_json("state::update", b'{"scope":"%s","key":"k","ops":['
                                   b'{"type":"increment","path":"n","by":1},'
                                   b'{"type":"increment","path":"big","by":1}]}' % scope.encode())
    new = dict(exact_load(result))["new_value"]
    assert new == exact_load(start.replace(b'"big":9007199254740993', b'"big":9007199254740994')
                             .replace(b'"n":0', b'"n":1'))
    stored = await store.call_json("state::get", b'{"scope":"%s","key":"k"}' % scope.encode())
    assert stored == (b'{"big":9007199254740994,"dec":1.2300,"e":1E+2,"arr":[],"obj":{},'
                      b'"z":{"y":[{}],"x":-0.0},"u":"\xc3\xa9\\n<&>","n":1}')


async def test_hash_after_update_is_the_canonical_hash(store: StateStore, scope: str) -> None:
    await store.call("state::update", {"scope": scope, "key": "k", "ops": [
        {"type": "set", "path": "last_id", "value": 123}]})
    entry = await store.get_entry(scope, "k")
    assert entry.hash == "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
    # compare-and-set right after an update (hash unknown until computed) still works
    await store.call("state::update", {"scope": scope, "key": "k", "ops": [
        {"type": "increment", "path": "last_id", "by": 1}]})
    swap = await store.compare_and_set(scope, "k", "done", expected={"last_id": 124})
    assert swap.swapped is True


async def test_library_state_of_one_call_does_not_leak_into_the_next(
    store: StateStore, scope: str
) -> None:
    # The Lua library outlives a call. The first update runs on a document with no bracket in
    # any string (the codec's fast container skip, for documents of 256 bytes or more); the
    # second one must not inherit that.
    plain = {"a": {"x": [1]}, "pad": "p" * 300, "n": 0}
    first = await update(store, scope, [{"type": "increment", "path": "n", "by": 1}],
                         start=plain, key="plain")
    assert first["new_value"] == plain | {"n": 1}
    tricky = {"a": {"s": "}", "n": 5}, "b": ["]", 7], "n": 0}
    second = await update(store, scope, [{"type": "increment", "path": "n", "by": 1},
                                         {"type": "set", "path": "z", "value": "}"}],
                          start=tricky, key="brackets")
    assert second["new_value"] == {"a": {"s": "}", "n": 5}, "b": ["]", 7], "n": 1, "z": "}"}
    third = await update(store, scope, [{"type": "increment", "path": "m", "by": 2}],
                         start=0, key="number")  # and a failed op leaves no errors behind
    assert third["new_value"] == 0
    assert [e["code"] for e in third["errors"]] == ["increment.target_not_object"]
    fourth = await update(store, scope, [{"type": "increment", "path": "n", "by": 1}],
                          key="plain")
    assert fourth["new_value"] == plain | {"n": 2}
    assert "errors" not in fourth


async def test_first_level_edits_in_any_order_land_in_place(store: StateStore, scope: str) -> None:
    result = await update(store, scope, [
        {"type": "set", "path": "c", "value": 30},
        {"type": "set", "path": "new", "value": [1]},
        {"type": "increment", "path": "a", "by": 1},
        {"type": "set", "path": "b", "value": "twenty"},
        {"type": "increment", "path": "c", "by": 1},
        {"type": "set", "path": "other", "value": None},
        {"type": "increment", "path": "new2", "by": 5},
        {"type": "set", "path": "new", "value": {"x": "}"}},
    ], start={"a": 1, "b": {"deep": [2]}, "c": 3, "z": "]"})
    assert list(result["new_value"]) == ["a", "b", "c", "z", "new", "other", "new2"]
    assert result["new_value"] == {"a": 2, "b": "twenty", "c": 31, "z": "]", "new": {"x": "}"},
                                   "other": None, "new2": 5}
    assert "errors" not in result


async def test_no_document_stays_held_by_the_library_after_its_call(
    store: StateStore, scope: str, raw: Any
) -> None:
    # The Lua library outlives calls; its reused tables must not keep a call's values alive.
    # Memory is collected lazily, so small updates run (at most 20,000) until it is back.
    async def lua_bytes() -> int:
        return int((await raw.info("memory"))["used_memory_vm_functions"])

    baseline = await lua_bytes()
    big = [{"type": "set", "path": f"f{i}", "value": f"{i:02d}" + "x" * 200_000} for i in range(16)]
    with pytest.raises(StateError) as too_large:  # 3.2 MB: over the 1 MiB limit
        await update(store, scope, big, start={"a": 1}, key="big")
    assert too_large.value.code == "VALUE_TOO_LARGE"
    assert await lua_bytes() > baseline + 3_000_000  # the values went through Lua
    for n in range(20_000):
        await update(store, scope, [{"type": "increment", "path": "n", "by": 1}], key="small")
        if n % 500 == 0 and await lua_bytes() < baseline + 1_000_000:
            break
    assert await lua_bytes() < baseline + 1_000_000


async def test_update_sets_and_keeps_expiry(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    increment = [{"type": "increment", "path": "n", "by": 1}]
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        async def update(key: str, **extra: int) -> None:
            await store.call("state::update", {"scope": scope, "key": key, "ops": increment,
                                               **extra})

        await store.set(scope, "k", {"n": 0})
        before = now_ms()
        await update("k", ttl_ms=HOUR_MS)  # a ttl on an entry that had none
        after = now_ms()
        first = await stored_expiry(store, scope, "k")
        assert first is not None and before + HOUR_MS <= first <= after + HOUR_MS
        assert (await store.get_entry(scope, "k")).expires_at is not None
        await update("k")  # no ttl_ms: the expiry stays as it was
        assert await stored_expiry(store, scope, "k") == first
        before = now_ms()
        await update("k", ttl_ms=2 * HOUR_MS)  # a new ttl: from now
        after = now_ms()
        second = await stored_expiry(store, scope, "k")
        assert second is not None and before + 2 * HOUR_MS <= second <= after + 2 * HOUR_MS
        assert await store.get(scope, "k") == {"n": 3}
        # an update that creates the entry sets its ttl too, and the entry does expire
        before = now_ms()
        await update("short", ttl_ms=30)
        after = now_ms()
        expires = await stored_expiry(store, scope, "short")
        assert expires is not None and before + 30 <= expires <= after + 30
        await pass_time(expires)
        assert await store.get(scope, "short") is None
        assert await store.reap_expired() == 1
        assert [(e.type, e.key, bytes(e.old_value)) for e in await store.events(scope)
                if e.key == "short"] == [("state:created", "short", b"null"),
                                         ("state:deleted", "short", b'{"n":1}')]


def _nest(depth: int) -> Any:
    return {"a": _nest(depth - 1)} if depth else 1


# Every op error code, each from a real update: (document, ops).
_LONG, _DEEP = "x" * 257, [f"s{i}" for i in range(33)]
_EVERY_CODE: list[tuple[Any, list[dict[str, Any]]]] = [
    ("text", [{"type": "set", "path": "a"}, {"type": "remove", "path": "a"},
              {"type": "increment", "path": "a", "by": 1},
              {"type": "decrement", "path": "a", "by": 1},
              {"type": "increment", "path": "", "by": 1},
              {"type": "decrement", "path": "", "by": 1},
              {"type": "merge", "value": {"a": 1}}, {"type": "append", "path": "a", "value": 1},
              {"type": "append", "value": 1}]),
    ({"n": 2**63 - 1}, [{"type": "increment", "path": "n", "by": 1},
                        {"type": "decrement", "path": "n", "by": -1}]),
    ({}, [{"type": op, "path": path, **({"by": 1} if op.endswith("crement") else {})}
          for op in ("set", "remove", "increment", "decrement")
          for path in (_LONG, "__proto__")]),
    ({}, [{"type": op, "path": path, "value": {}}
          for op in ("merge", "append") for path in (_DEEP, ["a", ""], [_LONG], ["__proto__"])]),
    ({}, [{"type": "merge", "value": value} for value in (
        [1], {"__proto__": 1}, {f"k{i}": i for i in range(1025)}, _nest(17))]),
]



async def test_every_op_code_links_to_its_section_of_the_errors_doc(
        store: StateStore, scope: str) -> None:
    """iii's op error shape `{op_index, code, message, doc_url}`: every code an op can give
    (OP_CODES, each with its section in docs/errors.md: tests/unit/test_errors_doc.py)."""
    seen: set[str] = set()
    for i, (start, ops) in enumerate(_EVERY_CODE):
        result = await update(store, scope, ops, start=start, key=f"k{i}")
        assert len(result["errors"]) == len(ops), result["errors"]
        for error in result["errors"]:
            assert set(error) == {"op_index", "code", "message", "doc_url"}
            assert error["doc_url"] == f"{ERRORS_DOC_URL}#{error['code'].replace('.', '')}"
            seen.add(error["code"])
    assert seen == set(OP_CODES)
