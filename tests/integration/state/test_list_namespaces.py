"""state::list-namespaces reads only what it gives: the range of its pattern's literal head, a
chunk of each partition's scopes index at a time, merged in byte order. It answers exactly what
state::list_groups, filtered and cut, answered (the read it was before), for any scopes,
pattern, limit and hidden scopes; and a limited call sends a small part of the index."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.patterns import glob_match, glob_parts
from stateworker.state.kv import listing
from stateworker.state.kv.reads import expired_scopes_plan
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

# Scope text around the byte-order edges: ASCII, two- and three-byte UTF-8, the largest code
# point (bytes F4 8F BF BF: still below the byte 255 that ends a head's range), and `*`.
CHARS = "ab*é中\U0010ffff"
names = st.text(alphabet=CHARS, max_size=4)


async def old_namespaces(store: StateStore, pattern: str | None, limit: int,
                         hidden: frozenset[str]) -> list[str]:
    """What list-namespaces answered before: every scope (each scopes index whole), filtered,
    cut."""
    state = store.state
    parts = state.keys.all_partitions()
    names = await state.execute(state.read_plan(
        parts, [["ZRANGE", part.scopes, 0, -1] for part in parts],
        lambda replies: {name for reply in replies for name in reply}))
    gone = await state.execute(expired_scopes_plan(state))
    groups = sorted(n.decode() for n in names if n.decode() not in hidden | gone)
    if pattern is not None:
        groups = [g for g in groups if glob_match(g, glob_parts(pattern))]
    return list(groups[:limit])


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scopes=st.sets(names, max_size=24), pattern=st.none() | st.text(CHARS, max_size=4),
       limit=st.integers(1, 6), chunk=st.none() | st.integers(1, 3),
       hide=st.sets(names, max_size=8))
@example(scopes={"a", "a\U0010ffff", "ab", "b"}, pattern="a*", limit=6, chunk=1,
         hide=set())  # (the largest code point inside the head's range, the next head outside)
async def test_the_namespaces_are_the_old_ones(
        store: StateStore, scopes: set[str], pattern: str | None, limit: int,
        chunk: int | None, hide: set[str]) -> None:
    hidden = frozenset(hide) | {"state_barrier"}  # (claimed scopes and reserved ones)
    async with scoped(store, scopes):
        got = await store.state.execute(listing.list_namespaces_plan(
            store.state, pattern, limit, hidden, chunk))
        assert got == await old_namespaces(store, pattern, limit, hidden)


@pytest.fixture
async def many(own_redis: RedisServer, prefix: str) -> AsyncIterator[StateStore]:
    """5,000 scopes in 4 partitions, on a Redis of the test's own (its output bytes counted)."""
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        async def writer(first: int) -> None:
            for i in range(first, 5000, 50):
                await store.set(f"scope-{i:05d}", "k", i)

        async with anyio.create_task_group() as tg:
            for first in range(50):
                tg.start_soon(writer, first)
        yield store


async def sent_for(store: StateStore, fn: str, body: dict[str, Any]) -> tuple[Any, int]:
    """The call's result and the bytes Redis sent its clients meanwhile (INFO's own replies
    included: the same for every call measured)."""
    before = await output_bytes(store)
    result = await store.call(fn, body)
    return result, await output_bytes(store) - before


async def output_bytes(store: StateStore) -> int:
    info: bytes = await store.state.conn.execute("INFO", "stats")
    line = next(x for x in info.decode().splitlines() if x.startswith("total_net_output_bytes:"))
    return int(line.split(":")[1])


async def test_a_limited_call_reads_a_small_part_of_the_index(many: StateStore) -> None:
    groups, whole = await sent_for(many, "state::list_groups", {})
    assert len(groups["groups"]) == 5000
    for body, first in (({"pattern": "scope-03*", "limit": 10}, "scope-03000"),
                        ({"pattern": "*7", "limit": 10}, "scope-00007"),  # (no head)
                        ({"limit": 10}, "scope-00000")):
        listed, sent = await sent_for(many, "state::list-namespaces", body)
        assert len(listed["namespaces"]) == 10 and listed["namespaces"][0] == first, body
        assert sent * 10 < whole, (body, sent, whole)  # (the whole index: ~100 KB)


class scoped:
    """An entry in each of `scopes` while the block runs; none after (nor their scopes)."""

    def __init__(self, store: StateStore, scopes: set[str]) -> None:
        self.store, self.scopes, self.key = store, scopes, f"k-{uuid.uuid4().hex[:6]}"

    async def __aenter__(self) -> None:
        for scope in self.scopes:
            await self.store.set(scope, self.key, 1)

    async def __aexit__(self, *_: object) -> None:
        for scope in self.scopes:
            await self.store.delete(scope, self.key)
