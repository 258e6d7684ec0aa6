"""`state::query` and its indexes on one server and on the 3+3 Redis Cluster: scopes in
every partition (so every primary on the cluster), the same results with and without an index,
paged, after updates, deletes and a build; the index keys in the scope's slot."""

from __future__ import annotations

import uuid

import pytest

from stateworker import StateStore
from stateworker.transport.slots import key_slot
from tests.querymodel import put, query_all, reference

pytestmark = pytest.mark.anyio

SCOPES = [f"s{n}" for n in range(8)]  # enough scopes for every one of the 4 partitions
VALUES = ["1", "1.0", "2", "-0", '"a"', '"ab"', "true", "null", "123456789012345678901234567890",
          "{}", "0.5"]
WHERES = [
    [{"pointer": "/v", "op": "eq", "value": "1"}],
    [{"pointer": "/v", "op": "in", "value": '["a", 0]'}],
    [{"pointer": "/v", "op": "gte", "value": "0.5"}, {"pointer": "/w", "op": "lt", "value": "5"}],
    [{"pointer": "/v", "op": "prefix", "value": '"a"'}],
    [{"pointer": "/v", "op": "ne", "value": "1"}],
    [{"pointer": "/v", "op": "exists", "value": "false"}],
]


async def test_query_and_indexes(store_on: StateStore) -> None:
    scopes = [f"{s}-{uuid.uuid4().hex[:6]}" for s in SCOPES]
    for scope in scopes:
        for n in range(40):
            doc = f'{{"v": {VALUES[n % len(VALUES)]}, "w": {n % 9}}}' if n % 13 else "{}"
            await put(store_on, scope, f"k{n:02}", doc)
    for scope in scopes:
        before = [await reference(store_on, scope, w) for w in WHERES]
        for where, expected in zip(WHERES, before, strict=True):
            assert (await query_all(store_on, scope, where, limit=3))[0] == expected
        created = await store_on.call("state::create-index", {"scope": scope, "pointer": "/v"})
        assert created == {"created": True, "building": False}
        for where, expected in zip(WHERES, before, strict=True):
            got, used = await query_all(store_on, scope, where, limit=3)
            assert got == expected, where
            assert used == ({"/v"} if where[0]["op"] not in ("ne", "exists") else set())
        await put(store_on, scope, "k01", '{"v": 1}')
        await store_on.call("state::delete", {"scope": scope, "key": "k00"})
        await store_on.call("state::update", {"scope": scope, "key": "k02", "ops": [
            {"type": "set", "path": "v", "value": "ab"}]})
        for where in WHERES:
            assert (await query_all(store_on, scope, where, limit=4))[0] == \
                await reference(store_on, scope, where)
        assert await store_on.call("state::list-indexes", {"scope": scope}) == {"indexes": [
            {"pointer": "/v", "state": "ready", "indexed": 39, "total": 39}]}
        part = store_on.state.keys.for_scope(scope)
        slot = key_slot(part.key_index(scope))
        assert key_slot(part.index_defs(scope)) == key_slot(part.value_index(scope, "/v")) == slot
        assert await store_on.call("state::drop-index", {"scope": scope, "pointer": "/v"}) == {
            "dropped": True}
