"""`state::update` through Redis agrees with the plain-Python reference (tests/reference_ops.py).

Random op sequences on random documents run through the real service and the reference; the
resulting value and the `errors` list must be identical (exact number text, key order, [] vs
{}). A few explicit examples pin the tricky cases.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateError, StateStore
from stateworker.error_codes import doc_url
from stateworker.state.kv.ops import OP_CODES
from tests.jsontext import Num, Obj, deep, exact_load, json_trees, strings, to_text
from tests.reference_ops import (
    INT64_MAX,
    INT64_MIN,
    MISSING,
    RefError,
    apply_ops,
    update_body,
)

pytestmark = pytest.mark.anyio

FIELDS = ["a", "b", "n", "s", "a.b", "é", "<&>\u2028\x7f", 'q"\\😀']
RARE_SEGMENTS = ["__proto__", "constructor", "prototype", "", "x" * 257, "é" * 128, "é" * 129, "nu\x00l",
                 "[a, b]"]

# ---- strategies ----------------------------------------------------------------------------------
special_nums = st.sampled_from([
    "0", "1", "-1", "7", "-0", "0.0", "-0.0", "1.5", "1e2", "-0.25", "2.5E3", "0.1", "-1e-7", "1e308",
    "-1.7976931348623157e308", "1E400", "9007199254740993.0", "123456789.125", str(2**64),
]).map(Num)
edge_ints = st.one_of(st.integers(INT64_MAX - 2, INT64_MAX + 2), st.integers(INT64_MIN - 2, INT64_MIN + 2),
                      st.integers(-(2**53) - 2, -(2**53) + 2)).map(lambda i: Num(str(i)))
plain_ints = st.integers(INT64_MIN, INT64_MAX).map(lambda i: Num(str(i)))
small_strings = st.sampled_from(["", "x", "hello", "é😀", "a\nb", '"q"', "\\"])
leaves = st.one_of(special_nums, edge_ints, edge_ints, plain_ints, small_strings, st.none(), st.booleans(),
                   st.just([]), st.just(Obj()))


def field_objects(children: st.SearchStrategy[Any], max_size: int = 4) -> st.SearchStrategy[Obj]:
    return st.lists(st.tuples(st.sampled_from(FIELDS), children), max_size=max_size,
                    unique_by=lambda kv: kv[0]).map(Obj)


values = st.recursive(
    leaves, lambda children: st.one_of(st.lists(children, max_size=3), field_objects(children, 3)),
    max_leaves=8)
documents = st.one_of(field_objects(values, 5), field_objects(values, 5), json_trees, leaves)
starts = st.one_of(st.just(MISSING), documents, documents, documents)

single_paths = st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS), st.just(""),
                         st.sampled_from(RARE_SEGMENTS))
ABSENT = object()  # a path key left out of the op
array_paths: st.SearchStrategy[list[str]] = st.one_of(
    st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3),
    st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3),
    st.lists(st.sampled_from(FIELDS + RARE_SEGMENTS), min_size=1, max_size=3),
    st.just([]),
    st.sampled_from([["a"] * 32, ["a"] * 33, ["a", ""] * 17]),
)
nested_paths = st.one_of(st.just(ABSENT), st.sampled_from([None, ""]), single_paths, array_paths,
                         array_paths)
bys = st.one_of(
    st.sampled_from([0, 1, -1, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1, 2**62, -(2**62)]),
    st.integers(-3, 3),
    st.integers(INT64_MIN, INT64_MAX),
)
merge_values = st.one_of(
    field_objects(values, 4), field_objects(values, 4),
    json_trees.filter(lambda t: isinstance(t, Obj)),
    leaves,
    field_objects(values, 3).map(lambda o: Obj([*o, ("__proto__", Num("1"))])),
    st.sampled_from([
        Obj([("constructor", Obj())]), Obj([("k", deep(15))]), Obj([("k", deep(16))]), deep(17),
    ]),
)
append_values = st.one_of(small_strings, strings, values)


def _with_path(op: dict[str, Any], path: Any) -> dict[str, Any]:
    if path is not ABSENT:
        op["path"] = path
    return op


set_ops = st.one_of(
    st.builds(lambda p, v: {"type": "set", "path": p, "value": v}, single_paths,
              st.one_of(values, json_trees)),
    st.builds(lambda p: {"type": "set", "path": p}, single_paths),
)
remove_ops = st.builds(lambda p: {"type": "remove", "path": p}, single_paths)
add_ops = st.builds(lambda t, p, b: {"type": t, "path": p, "by": b},
                    st.sampled_from(["increment", "decrement"]), single_paths, bys)
merge_ops = st.builds(lambda p, v: _with_path({"type": "merge"}, p) | {"value": v},
                      nested_paths, merge_values)
append_ops = st.builds(lambda p, v: _with_path({"type": "append"}, p) | {"value": v},
                       nested_paths, append_values)
ops_lists = st.lists(st.one_of(set_ops, remove_ops, add_ops, add_ops, merge_ops, append_ops),
                     min_size=1, max_size=6)


# ---- running both sides ----------------------------------------------------------------------------
def _address(scope: str, key: str) -> str:
    return f'"scope":{json.dumps(scope)},"key":{json.dumps(key)}'


class Product(NamedTuple):
    """What the update did in Redis."""

    new_value: str  # the reply's new_value, as text
    errors: list[RefError]
    stored: str  # the value read back
    old_value: str  # the reply's old_value
    version: int  # the reply's version
    stored_version: int  # the version read back
    events: list[tuple[str, str, str, int]]  # the update's events: (type, old, new, version)


async def last_revision(store: StateStore, scope: str) -> str:
    """The newest event id of the scope's partition stream ("-" when empty)."""
    events = store.state.keys.for_scope(scope).events
    newest = await store.state.conn.execute("XREVRANGE", events, "+", "-", "COUNT", 1)
    return newest[0][0].decode() if newest else "-"


async def run_product(store: StateStore, scope: str, start: Any,
                      ops: list[dict[str, Any]]) -> Product:
    """The ops run through Redis on a fresh key (set to `start` first unless MISSING)."""
    key = f"k-{uuid.uuid4().hex}"
    if start is not MISSING:
        await store.call_json("state::set", f"{{{_address(scope, key)},\"value\":{to_text(start)}}}")
    after = await last_revision(store, scope)
    result = dict(exact_load(await store.call_json("state::update", update_body(scope, key, ops))))
    errors = [(int(e["op_index"]), e["code"], e["message"])
              for e in (dict(item) for item in result.get("errors", []))]
    for item in result.get("errors", []):  # every code listed, linked to its section
        assert dict(item)["code"] in OP_CODES and dict(item)["doc_url"] == doc_url(
            dict(item)["code"])
    entry = dict(exact_load(await store.call_json(
        "state::get-entry", f"{{{_address(scope, key)}}}")))
    events = [(e.type, to_text(exact_load(bytes(e.old_value))),
               to_text(exact_load(bytes(e.new_value))), e.version)
              for e in await store.events(scope, after) if e.key == key]
    return Product(to_text(result["new_value"]), errors, to_text(entry["value"]),
                   to_text(result["old_value"]), int(result["version"]), int(entry["version"]),
                   events)


async def check(store: StateStore, scope: str, start: Any, ops: list[dict[str, Any]]) -> None:
    expected_value, expected_errors, written = apply_ops(start, ops)
    got = await run_product(store, scope, start, ops)
    request = update_body(scope, "KEY", ops).decode()
    start_text = "null" if start is MISSING else to_text(start)
    context = f"start={'MISSING' if start is MISSING else start_text} request={request}"
    assert got.errors == expected_errors, context
    assert got.new_value == to_text(expected_value), context
    assert got.stored == got.new_value, context
    assert got.old_value == start_text, context
    # the version moves, and one event is written, exactly when the entry is written
    version = (0 if start is MISSING else 1) + (1 if written else 0)
    assert got.version == got.stored_version == version, context
    kind = "state:created" if start is MISSING else "state:updated"
    expected_events = [(kind, start_text, got.new_value, version)] if written else []
    assert got.events == expected_events, context


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(start=starts, ops=ops_lists)
async def test_update_matches_reference(
    store: StateStore, scope: str, start: Any, ops: list[dict[str, Any]]
) -> None:
    await check(store, scope, start, ops)


# ---- explicit examples -----------------------------------------------------------------------------
def _start(text: str | None) -> Any:
    return MISSING if text is None else exact_load(text)


EXAMPLES: list[tuple[str | None, list[dict[str, Any]], str, list[tuple[int, str]]]] = [
    # (start document text or None for a missing key, ops, expected value text, [(index, code)])
    (None, [{"type": "increment", "path": "", "by": 5}], "5", []),
    (None, [{"type": "decrement", "path": "", "by": 5}], "-5", []),
    (None, [{"type": "decrement", "path": "", "by": INT64_MIN}], "{}",
     [(0, "decrement.out_of_range")]),
    (None, [{"type": "append", "value": "hi"}], '"hi"', []),
    (None, [{"type": "append", "path": [], "value": ["x"]}], '[["x"]]', []),
    # a failed op leaves the key fresh; an applied one ends it
    (None, [{"type": "merge", "value": 1}, {"type": "increment", "path": "", "by": 3}], "3",
     [(0, "merge.value.not_an_object")]),
    (None, [{"type": "set", "path": "a", "value": Num("1")}, {"type": "increment", "path": "", "by": 1}],
     '{"a":1}', [(1, "increment.not_number")]),
    (None, [{"type": "set", "path": "a"}, {"type": "append", "value": "x"}], '{"a":null}',
     [(1, "append.type_mismatch")]),
    # literal field names, key order
    ('{"a":{"b":1},"z":0}', [{"type": "set", "path": "a.b", "value": Num("2")},
                              {"type": "set", "path": "a", "value": Num("3")}],
     '{"a":3,"z":0,"a.b":2}', []),
    # exact integers at the 64-bit edges, floats written shortest with ".0"
    ('{"n":9223372036854775806}', [{"type": "increment", "path": "n", "by": 1},
                                   {"type": "increment", "path": "n", "by": 1}],
     '{"n":9223372036854775807}', [(1, "increment.out_of_range")]),
    ('{"n":-9223372036854775808}', [{"type": "decrement", "path": "n", "by": -1},
                                    {"type": "decrement", "path": "n", "by": INT64_MAX},
                                    {"type": "decrement", "path": "n", "by": INT64_MIN}],
     '{"n":1}', [(1, "decrement.out_of_range")]),
    ('{"n":0}', [{"type": "decrement", "path": "n", "by": INT64_MIN}], '{"n":0}',
     [(0, "decrement.out_of_range")]),
    ('{"f":1.5,"g":1e2,"h":0.1,"i":-0.25}',
     [{"type": "increment", "path": "f", "by": 1}, {"type": "increment", "path": "g", "by": 0},
      {"type": "increment", "path": "h", "by": 0}, {"type": "decrement", "path": "i", "by": 1}],
     '{"f":2.5,"g":100.0,"h":0.1,"i":-1.25}', []),
    ('{"a":123456789.123456789,"b":1E20,"c":2.5E3,"d":9007199254740993.0,"e":-1e-7,"f":1e-320,"g":-0.0}',
     [{"type": "increment", "path": "a", "by": 1}, {"type": "increment", "path": "b", "by": 0},
      {"type": "increment", "path": "c", "by": 1}, {"type": "increment", "path": "d", "by": 1},
      {"type": "decrement", "path": "e", "by": 0}, {"type": "increment", "path": "f", "by": 0},
      {"type": "decrement", "path": "g", "by": 0}],
     '{"a":123456790.12345679,"b":1e+20,"c":2501.0,"d":9007199254740992.0,"e":-1e-07,'
     '"f":9.99988867182683e-321,"g":0.0}', []),
    ('{"f":1e308}', [{"type": "increment", "path": "f", "by": INT64_MAX}], '{"f":1e+308}', []),
    ('{"f":1E400}', [{"type": "increment", "path": "f", "by": 0}], '{"f":1E400}',
     [(0, "increment.out_of_range")]),
    ('{"n":null}', [{"type": "increment", "path": "n", "by": 0}], '{"n":null}',
     [(0, "increment.not_number")]),
    # an existing integer outside the 64-bit range is out of range even when the sum is not
    ('{"n":9223372036854775808}', [{"type": "increment", "path": "n", "by": -1}],
     '{"n":9223372036854775808}', [(0, "increment.out_of_range")]),
    ('{"n":-9223372036854775809}', [{"type": "decrement", "path": "n", "by": -1}],
     '{"n":-9223372036854775809}', [(0, "decrement.out_of_range")]),
    # duplicate keys in a value: the last value wins
    (None, [{"type": "set", "path": "a", "value": Obj([("x", Num("1")), ("y", Num("2")), ("x", Num("3"))])},
            {"type": "merge", "value": Obj([("b", Num("1")), ("b", [])])}],
     '{"a":{"x":3,"y":2},"b":[]}', []),
    # merge value limits: 1024 top-level keys are fine, 1025 are too many
    ("{}", [{"type": "merge", "value": Obj([(f"k{i}", Num("0")) for i in range(1025)])},
            {"type": "merge", "path": "m", "value": Obj([(f"k{i}", Num("0")) for i in range(1024)])}],
     "{" + '"m":{' + ",".join(f'"k{i}":0' for i in range(1024)) + "}}",
     [(0, "merge.value.too_many_keys")]),
    # merge: root of a non-object is an op error; along a path everything becomes an object
    ("[1]", [{"type": "merge", "value": Obj([("a", Num("1"))])}], "[1]",
     [(0, "merge.target_not_object")]),
    ("[1]", [{"type": "merge", "path": ["a", "b"], "value": Obj([("c", [])])}], '{"a":{"b":{"c":[]}}}',
     []),
    ('{"a":5,"b":1}', [{"type": "merge", "path": "a", "value": Obj([("x", Obj()), ("b", Num("2"))])}],
     '{"a":{"x":{},"b":2},"b":1}', []),
    ('{"a":1,"b":2}', [{"type": "merge", "value": Obj([("c", Num("3")), ("a", Num("0"))])}],
     '{"a":0,"b":2,"c":3}', []),
    # append: one array element per op, string concatenation, first values by path form
    ('{"l":[1]}', [{"type": "append", "path": "l", "value": [Num("2")]}], '{"l":[1,[2]]}', []),
    ('{"s":"ab"}', [{"type": "append", "path": "s", "value": "cd"},
                    {"type": "append", "path": "s", "value": Num("1")}],
     '{"s":"abcd"}', [(1, "append.type_mismatch")]),
    ("{}", [{"type": "append", "path": "s", "value": "x"}, {"type": "append", "path": ["t"], "value": "x"},
            {"type": "append", "path": ["u", "v"], "value": "x"}, {"type": "append", "path": "w",
                                                                    "value": Num("1")}],
     '{"s":"x","t":["x"],"u":{"v":["x"]},"w":[1]}', []),
    ('{"o":{}}', [{"type": "append", "path": "o", "value": "x"}], '{"o":{}}', [(0, "append.type_mismatch")]),
    ('"s"', [{"type": "append", "path": ["a", "b"], "value": "x"}], '"s"', [(0, "append.target_not_object")]),
    # path checks
    ("{}", [{"type": "append", "path": ["a", "", "__proto__"], "value": "x"},
            {"type": "merge", "path": ["__proto__"], "value": 1},
            {"type": "set", "path": "constructor"},
            {"type": "merge", "path": ["a"] * 33, "value": Obj()},
            {"type": "merge", "value": Obj([("k", deep(16))])},
            {"type": "merge", "value": Obj([("k", Num("1")), ("prototype", Num("1"))])}],
     "{}", [(0, "append.path.empty_segment"), (1, "merge.path.proto_polluted"),
            (2, "set.path.proto_polluted"), (3, "merge.path.too_deep"), (4, "merge.value.too_deep"),
            (5, "merge.value.proto_polluted")]),
]


@pytest.mark.parametrize(
    ("start", "ops", "value", "codes"), EXAMPLES,
    ids=[f"{i}-{'+'.join(op['type'] for op in ex[1])}" for i, ex in enumerate(EXAMPLES)])
async def test_update_examples(
    store: StateStore, scope: str, start: str | None, ops: list[dict[str, Any]], value: str,
    codes: list[tuple[int, str]],
) -> None:
    expected_value, expected_errors, _ = apply_ops(_start(start), ops)
    assert to_text(expected_value) == to_text(exact_load(value))  # the reference itself
    assert [(i, c) for i, c, _ in expected_errors] == codes
    await check(store, scope, _start(start), ops)


async def test_error_messages(store: StateStore, scope: str) -> None:
    ops: list[dict[str, Any]] = [
        {"type": "set", "path": "a", "value": Num("1")},
        {"type": "increment", "path": "a", "by": 1},
        {"type": "append", "path": "a", "value": "x"},
        {"type": "append", "path": ["a"], "value": "x"},
        {"type": "append", "path": [], "value": Num("1")},
        {"type": "merge", "path": "a", "value": Obj([("s", "x")])},
        {"type": "append", "path": ["a", "s"], "value": Num("1")},
        {"type": "set", "path": "", "value": "str"},
        {"type": "set", "path": "a"},
        {"type": "remove", "path": "a"},
        {"type": "decrement", "path": "a", "by": 1},
        {"type": "append", "path": ["a", "b"], "value": Num("1")},
        {"type": "append", "path": "", "value": Num("1")},
        {"type": "increment", "path": "", "by": 1},
        {"type": "merge", "path": ["x" * 257], "value": Obj()},
    ]
    _, errors, _ = apply_ops(MISSING, ops)
    assert errors == [
        (2, "append.type_mismatch", "Cannot append at path 'a': target is number, expected array, "
                                    "string, null, or missing field."),
        (3, "append.type_mismatch", "Cannot append at path 'a': target is number, expected array, "
                                    "string, null, or missing field."),
        (4, "append.type_mismatch", "Cannot append at path 'root': target is object, expected array, "
                                    "string, null, or missing field."),
        (6, "append.type_mismatch", "Expected string append value at path 's', got number."),
        (8, "set.target_not_object", "Cannot set at path 'a': target is string, expected object."),
        (9, "remove.target_not_object", "Cannot remove at path 'a': target is string, expected object."),
        (10, "decrement.target_not_object",
         "Cannot decrement at path 'a': target is string, expected object."),
        (11, "append.target_not_object",
         "Cannot append at path '[a, b]': target is string, expected object."),
        (12, "append.type_mismatch", "Expected string append value at path 'root', got number."),
        (13, "increment.not_number", "Expected number at path 'root', got string."),
        (14, "merge.path.segment_too_long", "Path segment of 257 bytes exceeds maximum of 256"),
    ]
    await check(store, scope, MISSING, ops)


async def test_number_text_kept_for_negative_zero(store: StateStore, scope: str) -> None:
    """`-0` is a JSON integer; its text must come back as written (contract: exact number text)."""
    ops: list[dict[str, Any]] = [{"type": "set", "path": "z", "value": Num("-0")}]
    assert to_text(apply_ops(MISSING, ops)[0]) == '{"z":-0}'
    await check(store, scope, MISSING, ops)


async def test_field_name_with_nul_in_message(store: StateStore, scope: str) -> None:
    """Paths are literal field names, so the message names the field exactly (a real U+0000)."""
    ops: list[dict[str, Any]] = [{"type": "set", "path": "", "value": "s"},
                                 {"type": "set", "path": "a\x00b", "value": Num("1")}]
    _, errors, _ = apply_ops(MISSING, ops)
    assert errors == [(1, "set.target_not_object",
                       "Cannot set at path 'a\x00b': target is string, expected object.")]
    await check(store, scope, MISSING, ops)


async def test_unchanged_entry_is_not_written(store: StateStore, scope: str) -> None:
    key = f"k-{uuid.uuid4().hex}"
    address = _address(scope, key)
    first = dict(exact_load(await store.call_json("state::set", f'{{{address},"value":[1]}}')))
    ops: list[dict[str, Any]] = [{"type": "merge", "value": Obj([("a", Num("1"))])},
                                 {"type": "set", "path": "a"}]
    result = dict(exact_load(await store.call_json("state::update", update_body(scope, key, ops))))
    assert to_text(result["new_value"]) == to_text(result["old_value"]) == "[1]"
    assert result["version"] == first["version"]
    assert [dict(e)["code"] for e in result["errors"]] == ["merge.target_not_object",
                                                           "set.target_not_object"]
    assert apply_ops(exact_load("[1]"), ops)[2] is False


async def test_float_by_is_an_invalid_request(store: StateStore, scope: str) -> None:
    body = f'{{{_address(scope, "k")},"ops":[{{"type":"increment","path":"n","by":1.5}}]}}'
    with pytest.raises(StateError) as caught:
        await store.call_json("state::update", body)
    assert caught.value.code == "INVALID_REQUEST"


def _big_document() -> Any:
    """An object of ~40 KiB: past the size up to which update.lua splices raw text."""
    return Obj([(f"f{i:04d}", Obj([("n", Num(str(i))), ("s", "x" * 20), ("l", [Num("1")])]))
                for i in range(800)] + [("s", "start"), ("arr", [])])


async def test_many_ops_on_a_large_document_match_the_reference(store: StateStore,
                                                                scope: str) -> None:
    ops: list[dict[str, Any]] = []
    for i in range(60):
        ops += [
            {"type": "append", "path": "s", "value": f"-{i}"},  # one string, appended to often
            {"type": "append", "path": ["arr"], "value": Num(str(i))},
            {"type": "remove", "path": f"f{i:04d}"},
            {"type": "set", "path": f"f{(i + 1) % 5:04d}", "value": Num(str(i))},  # re-added last
            {"type": "increment", "path": "count", "by": 1},
        ]
    ops.append({"type": "merge", "path": ["f0100", "deep"], "value": Obj([("k", [])])})
    await check(store, scope, _big_document(), ops)


async def test_brackets_in_path_keys_do_not_break_later_updates(store: StateStore,
                                                                scope: str) -> None:
    # A key with a brace, put there by a path segment, must not end a container early when a
    # later update skips over it (the `s` "plain strings" flag must stay off).
    start = Obj([("pad", "y" * 300)])
    first = [{"type": "merge", "path": ["a", "x{"], "value": Obj([("c", Num("1"))])},
             {"type": "set", "path": "b", "value": Num("5")}]
    key = f"k-{uuid.uuid4().hex}"
    await store.call_json("state::set", f"{{{_address(scope, key)},\"value\":{to_text(start)}}}")
    await store.call_json("state::update", update_body(scope, key, first))
    await store.call_json("state::update", update_body(
        scope, key, [{"type": "increment", "path": "b", "by": 1}]))
    stored = exact_load(await store.call_json("state::get", f"{{{_address(scope, key)}}}"))
    assert to_text(stored) == '{"pad":"' + "y" * 300 + '","a":{"x{":{"c":1}},"b":6}'


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fields=st.lists(st.sampled_from(FIELDS + [f"f{i}" for i in range(30)]), min_size=10,
                       max_size=30, unique=True),
       ops=st.lists(st.one_of(set_ops, add_ops, add_ops, remove_ops), min_size=17, max_size=40))
async def test_long_first_level_batches_match_reference(
    store: StateStore, scope: str, fields: list[str], ops: list[dict[str, Any]]
) -> None:
    # More first-level ops than the raw-edit bound (16): pending edits are flushed and the
    # root object is opened mid-batch.
    start = Obj([(name, Num(str(i)) if i % 3 else Obj([("x", "}")])) for i, name in enumerate(fields)])
    await check(store, scope, start, ops)
