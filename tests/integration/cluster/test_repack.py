"""The upgrade to packed entries (state/kv/repack.py) on one server and on the 3+3 cluster: hash
entries of the older layout in partitions on every primary are packed (each partition's SCAN
goes to its node), and read as before."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from stateworker import StateStore
from stateworker.state.kv import repack
from tests.integration.cluster.conftest import SPREAD_PARTITIONS

pytestmark = pytest.mark.anyio


@pytest.fixture
async def spread_store(url: str, spread_prefix: str) -> AsyncIterator[StateStore]:
    async with StateStore.open(url, prefix=spread_prefix, partitions=SPREAD_PARTITIONS) as store:
        yield store


async def test_hash_entries_on_every_primary_are_packed(spread_store: StateStore,
                                                       spread_scopes: list[str]) -> None:
    store, conn = spread_store, spread_store.state.conn
    for i, scope in enumerate(spread_scopes):  # the layout before packed entries
        part = store.state.keys.for_scope(scope)
        await conn.execute("HSET", part.entry(scope, "old"), "v", f'{{"i":{i}}}', "n", "2",
                           "c", "1700000000000", "u", "1700000001000", "r", "1700000001000-4",
                           "t", "tag")
        await conn.execute("ZADD", part.key_index(scope), 0, "old")
        await conn.execute("ZADD", part.topic_index(scope), 0, "tag\0old")
        await conn.execute("ZADD", part.topic_index(scope), 0, b"\xff\x00gone")
        await conn.execute("ZADD", part.scopes, 0, scope)
    await conn.execute("HDEL", store.state.keys.meta, repack.LAYOUT_FIELD)
    store.state.created = False
    assert await repack.upgrade(store.state) == len(spread_scopes)
    for i, scope in enumerate(spread_scopes):
        got = await store.call("state::get-entry", {"scope": scope, "key": "old"})
        assert (got["value"], got["version"], got["topic"], got["revision"]) == (
            {"i": i}, 2, "tag", "1700000001000-4")
        part = store.state.keys.for_scope(scope)
        assert await conn.execute("ZRANGE", part.topic_index(scope), 0, -1) == [b"tag\0old"]
