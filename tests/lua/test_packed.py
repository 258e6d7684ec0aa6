"""An entry's stored form: the scripts (lua/includes/packed.lua) and Python (state/kv/packed.py)
read and write the same bytes. Python's entries are read by getmany.lua and written again by
sethash.lua and topic.lua (each reads, then packs); the scripts' entries are read by Python and
packed again to the same bytes."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.scripts.read_bindings import GETMANY, getmany_call
from stateworker.state.kv.packed import WIDE, Stored, pack, unpack
from stateworker.state.kv.reads import hash_plan

pytestmark = pytest.mark.anyio

MS = 1 << 47  # times (ms) up to the year 6429: the heads store 48 bits
FUTURE = 4_102_444_800_000  # 2100-01-01: an expiry no run reaches
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@st.composite
def stored_entries(draw: st.DrawFn) -> Stored:
    updated = draw(st.integers(0, MS - 1))
    near = draw(st.booleans())
    rev_ms = draw(st.integers(max(0, updated - 40_000), min(MS - 1, updated + 40_000)) if near
                  else st.integers(0, MS - 1))
    return Stored(
        value=draw(st.sampled_from([b"null", b"1", b'{"a":[1,2]}', b'"x' + b"y" * 300 + b'"'])),
        version=draw(st.integers(1, 1 << 24) | st.integers(1, (1 << 47))),
        created=draw(st.integers(0, updated)), updated=updated,
        revision=(rev_ms, draw(st.integers(0, 70_000))),
        hash=draw(st.none() | st.binary(min_size=32, max_size=32).map(bytes.hex)),
        expires=draw(st.none() | st.integers(FUTURE, MS - 1)),
        topic=draw(st.none() | texts), by=draw(st.none() | texts.filter(bool)),
        plain=draw(st.booleans()))


async def _getmany(store: StateStore, scope: str, key: str) -> list[Any]:
    part = store.state.keys.for_scope(scope)
    return await store.state.execute(store.state.script_plan(
        GETMANY, getmany_call(part, scope, [key], store.state.settings.max_call_bytes),
        lambda reply: reply.entries[0]))


def _text(raw: Any) -> str | None:
    return None if raw is None else raw.decode()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(entry=stored_entries())
async def test_the_scripts_read_and_repack_what_python_packed(store: StateStore,
                                                               entry: Stored) -> None:
    scope, key = f"p-{uuid.uuid4().hex[:8]}", "k"
    name = store.state.keys.for_scope(scope).entry(scope, key)
    stored = pack(entry)
    assert unpack(stored) == entry
    await store.state.conn.execute("SET", name, stored)
    v, n, h, t, c, u, x, b, r = await _getmany(store, scope, key)
    assert (v, n, h and h.hex(), _text(t), c, u, x, _text(b),
            r.decode()) == (entry.value, entry.version, entry.hash, entry.topic, entry.created,
                            entry.updated, entry.expires, entry.by,
                            "{}-{}".format(*entry.revision))
    if entry.hash is None:  # sethash.lua packs it again as it was, with the hash stored
        digest = await store.state.execute(hash_plan(store.state, scope, key, entry.version,
                                                     entry.value))
        entry.hash = digest
        assert await store.state.conn.execute("GET", name) == pack(entry)
    # topic.lua reads the entry and packs it again with a new topic and its event's revision
    await store.state.conn.execute("ZADD", store.state.keys.for_scope(scope).key_index(scope),
                                   0, key)
    assert await store.call("state::update-topic", {"scope": scope, "key": key,
                                                    "topic": "retagged"}) == {"updated": True}
    again = await store.state.conn.execute("GET", name)
    moved = unpack(again)
    assert moved == msgspec.structs.replace(entry, topic="retagged", revision=moved.revision)
    assert pack(moved) == again  # the same bytes, the same choice of narrow or wide head


async def test_python_reads_and_repacks_what_the_scripts_wrote(store: StateStore,
                                                                scope: str) -> None:
    writes = [({"value": {"a": 1}}, None), ({"value": [1], "topic": "t", "ttl_ms": 3_600_000},
                                               "writer-é"),
              ({"value": "x" * 500, "topic": ""}, None)]
    for i, (body, by) in enumerate(writes):
        key = f"k{i}"
        await store.call("state::set", {"scope": scope, "key": key, **body}, caller=by)
        stored = await store.state.conn.execute(
            "GET", store.state.keys.for_scope(scope).entry(scope, key))
        entry = unpack(stored)
        assert pack(entry) == stored
        got = await store.call("state::get-entry", {"scope": scope, "key": key})
        assert (entry.value, entry.version, entry.hash, entry.topic, entry.by) == (
            msgspec.json.encode(body["value"]), 1, got["hash"], body.get("topic"), by)
        assert "{}-{}".format(*entry.revision) == got["revision"]
        assert (entry.expires is not None) == ("ttl_ms" in body)
        assert stored[0] & WIDE == 0  # a fresh entry's numbers fit the narrow head
