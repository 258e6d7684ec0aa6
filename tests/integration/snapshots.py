"""Helpers of the snapshot tests: what Redis and PostgreSQL hold, side by side, read
independently of the snapshotter's own code (redis-py and psycopg; an entry's stored form with
state/kv/packed.py, which tests/lua/test_packed.py holds against the scripts)."""

from __future__ import annotations

import contextlib
import random
from typing import Any

import psycopg
import redis

from stateworker import StateStore
from stateworker.errors import StateError
from stateworker.keys import KeySpace
from stateworker.snapshot.names import from_pg
from stateworker.state.kv.packed import unpack


def redis_entries(client: redis.Redis, keys: KeySpace) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(scope, key) -> (value text, version, hash, topic, expires ms) of every entry."""
    found: dict[tuple[str, str], tuple[Any, ...]] = {}
    for part in keys.all_partitions():
        names = list(client.scan_iter(match=part.entry_prefix + "*", count=1000))
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(name)
            values = pipe.execute()
        for name, stored in zip(names, values, strict=True):
            e = unpack(stored)
            member = name[len(part.entry_prefix):]
            length, _, rest = member.partition(b":")
            scope, key = rest[:int(length)].decode(), rest[int(length):].decode()
            found[(scope, key)] = (e.value.decode(), e.version, e.hash, e.topic, e.expires)
    return found


def postgres_entries(url: str, prefix: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT scope, key, value_text, version, hash, topic, expires_ms "
                            "FROM sw_entries WHERE prefix = %s", (prefix,)).fetchall()
    return {(from_pg(r[0]), from_pg(r[1])): (*r[2:5], from_pg(r[5]), r[6]) for r in rows}


def caught_up(client: redis.Redis, keys: KeySpace) -> bool:
    """Every partition's snapshot position (mirrored in Redis) is at its stream's end."""
    for part in keys.all_partitions():
        added = client.xinfo_stream(part.events)["entries-added"] if client.exists(
            part.events) else 0
        done = client.hget(part.snapshotted, "n")
        if done is None or int(done) != added:
            return False
    return True


def calls_saved(client: redis.Redis, keys: KeySpace) -> bool:
    """The snapshot caught up, and every call record it kept for PostgreSQL stored there."""
    return caught_up(client, keys) and not any(
        client.xlen(p.unsaved_calls) for p in keys.all_partitions())


def all_dispatched(client: redis.Redis, keys: KeySpace) -> bool:
    """Every partition's dispatch position is at its stream's end."""
    return all(int(client.hget(p.dispatched, "n") or -1)
               == client.xinfo_stream(p.events)["entries-added"]
               for p in keys.all_partitions() if client.exists(p.events))


def nothing_to_reap(client: redis.Redis, keys: KeySpace, now_ms: int) -> bool:
    return all(client.zcount(p.ttl, "-inf", now_ms) == 0 for p in keys.all_partitions())


async def mixed_writes(store: StateStore, count: int, seed: int, scopes: int = 20,
                       keys_per_scope: int = 60) -> None:
    """`count` random writes: sets (some with a topic, some with a short or long expiry),
    updates, topic changes, deletes and deletes by topic, over a small key space so keys
    are written many times."""
    rng = random.Random(seed)
    for _ in range(count):
        scope = f"s{rng.randrange(scopes)}"
        key = f"k{rng.randrange(keys_per_scope)}"
        roll = rng.random()
        if roll < 0.45:
            await store.set(scope, key, {"n": rng.randrange(10**6), "text": "é\"\\ ü" * rng.randrange(3),
                                         "list": [1.5, None, True]},
                            topic=rng.choice([None, "red", "blue"]),
                            ttl_ms=rng.choice([None, None, None, 30, 3_600_000]))
        elif roll < 0.65:
            with contextlib.suppress(StateError):  # (an absent key: nothing to update)
                await store.call("state::update", {"scope": scope, "key": key, "ops": [
                    {"type": "set", "path": "n", "value": rng.randrange(100)}]})
        elif roll < 0.75:
            with contextlib.suppress(StateError):
                await store.call("state::update-topic", {"scope": scope, "key": key,
                                                         "topic": rng.choice(["red", "green"])})
        elif roll < 0.97:
            await store.delete(scope, key)
        else:
            await store.call("state::delete-by-topic", {"scope": scope,
                                                        "topic_pattern": rng.choice(["red", "b*"])})
