"""index.lua and lua/includes/indexes.lua through the functions that run them: the member a
write puts in an index is Python's encoding (state/query/predicates.py) of the value at the
pointer, for numbers in every JSON form, strings with every escape, nested pointers; the
build writes the same members as the writes."""

from __future__ import annotations

import json
import uuid

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.state.query import predicates as p
from tests.querymodel import put

pytestmark = pytest.mark.anyio

numbers = st.one_of(
    st.integers(-(10**40), 10**40).map(str),
    st.tuples(st.integers(-(10**6), 10**6), st.text("0123456789", min_size=1, max_size=12)).map(
        lambda t: f"{t[0]}.{t[1]}"),
    st.tuples(st.integers(-999, 999), st.sampled_from(["e", "E"]),
              st.sampled_from(["", "+", "-"]), st.integers(0, 999)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}"),
    st.sampled_from(["-0", "0.000", "-0.0e-5", "1e999999999999999", "1e1000000000000000",
                     "-1e-999999999999999", "0.0001e1000000000000000", "1e0000000000000000005"]),
)
strings = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
    ["\0", "\x1f", '"', "\\", "/", "\u2028", "😀"]), max_size=8).map(json.dumps)
scalars = st.one_of(numbers, strings, st.sampled_from(["true", "false", "null", "[]", "{}"]))
POINTERS = ["", "/a", "/a/b~1c", "/l/1"]


def place(pointer: str, text: str) -> str:
    return {"": text, "/a": f'{{"z": [1, {{"a": 0}}], "a": {text}}}',
            "/a/b~1c": f'{{"a": {{"b": 1, "b/c": {text}}}}}', "/l/1": f'{{"l": ["x", {text}]}}'}[pointer]


def expected(text: str, key: str) -> list[bytes]:
    value = p.decode(text)
    encoded = p.encode(value)
    if encoded is None and isinstance(value, p.Number):
        encoded = p.ODD
    return [] if encoded is None else [encoded + key.encode()]


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(texts=st.lists(scalars, min_size=1, max_size=6), pointer=st.sampled_from(POINTERS))
async def test_members_are_pythons_encoding(store: StateStore, texts: list[str],
                                            pointer: str) -> None:
    scope = f"i-{uuid.uuid4().hex[:8]}"
    await put(store, scope, "before", place(pointer, texts[0]))
    await store.call("state::create-index", {"scope": scope, "pointer": pointer})
    name = store.state.keys.for_scope(scope).value_index(scope, pointer)
    assert await store.state.conn.execute("ZRANGE", name, 0, -1) == expected(texts[0], "before")
    for text in texts:  # each write replaces the key's member
        await put(store, scope, "k", place(pointer, text))
        members = await store.state.conn.execute("ZRANGE", name, 0, -1)
        assert sorted(members) == sorted(expected(texts[0], "before") + expected(text, "k")), text
    await store.call_json("state::delete", msgspec.json.encode({"scope": scope, "key": "k"}))
    assert await store.state.conn.execute("ZRANGE", name, 0, -1) == expected(texts[0], "before")
