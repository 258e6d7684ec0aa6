"""The upgrade to packed entries (state/kv/repack.py, lua/repack.lua): a prefix written in the
layout before them (an entry a hash of fields, the topic index holding untagged entries too)
reads the same after a start, and is upgraded once."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aredis

from stateworker import StateStore, codec
from stateworker.app.service import StateService
from stateworker.errors import ConfigError
from stateworker.keys import KeySpace, member
from stateworker.state.kv import repack
from stateworker.state.kv.packed import unpack
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

HASH = "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
# key -> the fields the old scripts wrote (v n h t c u x b r s)
OLD: dict[str, dict[str, Any]] = {
    "a": {"v": '{"last_id":123}', "n": 3, "h": HASH, "c": 1700000000000, "u": 1700000005000,
          "r": "1700000005001-2", "s": "1"},
    "b": {"v": "[1]", "n": 1, "t": "orders", "c": 1700000000000, "u": 1700000000000,
          "x": 4102444800000, "b": "billing", "r": "1700000000000-0"},
    "c": {"v": '"x"', "n": 70000000, "t": "alpha", "c": 1600000000000, "u": 1700000000000,
          "r": "1700000100000-70000"},  # numbers out of the narrow head's range: the wide one
    "d": {"v": "null", "n": 2, "c": 1700000000000, "u": 1700000009000,
          "r": "1700000009000-0"},  # an update's unknown hash
    "e": {"v": "7", "n": 1, "h": "not-a-hash", "c": 1700000000000, "u": 1700000000000,
          "r": "1700000000000-1"},  # a damaged hash: left unknown, computed again on a read
}


async def _write_old(redis_server: RedisServer, prefix: str, scope: str) -> None:
    """The scope's entries as the layout before packed entries left them."""
    keys = KeySpace(prefix, 4)
    part = keys.for_scope(scope)
    conn = aredis.Redis(port=redis_server.port)
    for key, fields in OLD.items():
        await conn.hset(part.entry(scope, key), mapping=fields)
        await conn.zadd(part.key_index(scope), {key: 0})
        await conn.zadd(part.updated_index(scope), {key: fields["u"]})
        topic = fields.get("t")
        await conn.zadd(part.topic_index(scope),
                        {(topic.encode() if topic else b"\xff") + b"\0" + key.encode(): 0})
        if "x" in fields:
            await conn.zadd(part.ttl, {member(scope, key): fields["x"]})
    await conn.zadd(part.scopes, {scope: 0})
    await conn.hset(keys.meta, "partitions", 4)  # an existing prefix of that layout
    await conn.aclose()


async def test_entries_of_the_older_layout_read_the_same_after_a_start(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    await _write_old(redis_server, prefix, scope)
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store:
        part = store.state.keys.for_scope(scope)
        for key, fields in OLD.items():
            entry = unpack(await store.state.conn.execute("GET", part.entry(scope, key)))
            hash_ = fields.get("h") if fields.get("h") != "not-a-hash" else None
            assert (entry.value.decode(), entry.version, entry.hash, entry.topic, entry.created,
                    entry.updated, entry.expires, entry.by, "{}-{}".format(*entry.revision),
                    entry.plain) == (
                fields["v"], fields["n"], hash_, fields.get("t"), fields["c"],
                fields["u"], fields.get("x"), fields.get("b"), fields["r"], "s" in fields)
        got = await store.call("state::get-entry", {"scope": scope, "key": "b"})
        assert (got["value"], got["topic"], got["updated_by"], got["revision"]) == (
            [1], "orders", "billing", "1700000000000-0")
        # the topic index keeps the tagged; the untagged still come after every topic
        assert await store.state.conn.execute("ZRANGE", part.topic_index(scope), 0, -1) == [
            b"alpha\0c", b"orders\0b"]
        got = await store.call("state::get-entry", {"scope": scope, "key": "e"})
        assert got["hash"] == codec.hash_tree(7)  # computed again
        for order, keys in (("asc", ["c", "b", "a", "d", "e"]),
                            ("desc", ["e", "d", "a", "b", "c"])):
            listed = await store.call("state::list-entries", {
                "scope": scope, "order_by": "topic", "order": order})
            assert [e["key"] for e in listed["entries"]] == keys
        assert await repack.upgrade(store.state) == 0  # once: the layout is marked
        assert await store.state.conn.execute("HGET", store.state.keys.meta,
                                              repack.LAYOUT_FIELD) == repack.PACKED


async def test_no_upgrade_while_services_serve_the_prefix(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    """Services of the older layout would write hash entries into the upgraded prefix: while
    a dispatcher's heartbeat is live, a start that would upgrade is refused, naming why."""
    keys = service.state.keys
    await until(lambda: service.state.conn.execute("ZCARD", keys.replicas), 10,
                "the service's dispatcher heartbeat")
    await service.state.conn.execute("HDEL", keys.meta, repack.LAYOUT_FIELD)  # as before it
    with pytest.raises(ConfigError) as caught:
        async with StateStore.open(redis_server.url, prefix=prefix, partitions=4):
            pass
    assert "1 service(s) of that version serve it" in str(caught.value)
    assert "stop them, then start this version" in str(caught.value)
    assert await service.state.conn.execute("HGET", keys.meta, repack.LAYOUT_FIELD) is None
