"""Barriers in the PostgreSQL snapshot follow their expiry and their deletion: a completed
barrier's row goes once it expired, a deleted barrier's row goes, a barrier made again after
a deletion replaces the old row (it is numbered above it), and a restore leaves expired
barriers out and gives the others their expiry back."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
import pytest
import redis

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import restore_command
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def rows(postgres_url: str, prefix: str) -> dict[str, dict[str, Any]]:
    """id -> (the fields as stored, w, expires_ms) of the prefix's barrier rows."""
    with psycopg.connect(postgres_url) as conn:
        found = conn.execute("SELECT id, fields, w, expires_ms FROM sw_barriers WHERE prefix = %s",
                             (prefix,)).fetchall()
    return {str(i): {"fields": f, "w": int(w), "expires_ms": e} for i, f, w, e in found}


def nothing_changed(client: redis.Redis, keys: KeySpace) -> bool:
    return not any(client.scard(p.barriers_changed) for p in keys.all_partitions())


async def test_the_snapshot_follows_expiry_and_deletion_and_a_restore_keeps_it(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000, barrier_ttl_s=4)
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4,
                               barrier_ttl_s=4) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        await store.barrier({"key": "a"}, {"id": "short", "expect": 1})  # expires in 4 s
        await store.barrier({"key": "a"}, {"id": "open", "expect": 2})
        for key in ("a", "b", "c"):
            await store.barrier({"key": key}, {"id": "again", "expect": 9})
        await until(lambda: set(rows(postgres_url, prefix)) == {"short", "open", "again"}
                    and nothing_changed(client, keys), 30, "the three barriers in PostgreSQL")
        old = rows(postgres_url, prefix)["again"]["w"]
        # Deleted: its row goes; made again: its new state replaces the old row.
        assert await store.delete_barrier("again") is True
        await until(lambda: "again" not in rows(postgres_url, prefix), 30, "the deletion stored")
        await store.barrier({"key": "z"}, {"id": "again", "expect": 9})
        await until(lambda: rows(postgres_url, prefix).get("again", {}).get("w", 0) > old, 30,
                    "the barrier made again stored")
        assert rows(postgres_url, prefix)["again"]["fields"]["c"] == "1"
        # Expired: its row goes too (the hash went in Redis without a change to follow).
        await until(lambda: "short" not in rows(postgres_url, prefix), 30, "the expired row pruned")
        assert set(rows(postgres_url, prefix)) == {"open", "again"}
        # A completed barrier that has not expired yet comes back with its expiry; one that
        # expires after the service stopped stays in PostgreSQL until a restore leaves it out.
        await store.barrier({"key": "a"}, {"id": "kept", "expect": 1})
        await store.barrier({"key": "a"}, {"id": "lapses", "expect": 1})
        await until(lambda: {"kept", "lapses"} <= set(rows(postgres_url, prefix))
                    and nothing_changed(client, keys), 30, "the completed barriers stored")
    lapses = rows(postgres_url, prefix)["lapses"]["expires_ms"]
    await until(lambda: now_ms() > lapses, 10, "the barrier's expiry to pass")
    with psycopg.connect(postgres_url) as conn:  # "kept": kept longer than the test runs
        conn.execute("UPDATE sw_barriers SET expires_ms = %s, exact = %s WHERE prefix = %s AND "
                     "id = 'kept'", (now_ms() + 600_000, _with_expiry(
                         postgres_url, prefix, now_ms() + 600_000), prefix))
    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["barriers"] == 3  # open, again, kept
    names = {i: keys.barrier_partition(i).barrier(i) for i in ("open", "again", "kept", "lapses")}
    assert not client.exists(names["lapses"])
    assert client.pttl(names["open"]) == -1 and client.pttl(names["again"]) == -1
    assert 500_000 < client.pttl(names["kept"]) <= 600_000
    # Each partition's write counter came back at its highest barrier's `w`: a barrier that
    # expires and is made again before the prune numbers above its old row.
    for i in ("open", "again", "kept"):
        counter = client.get(keys.barrier_partition(i).barrier_writes)
        assert int(counter or 0) >= int(client.hget(names[i], "w") or 0) > 0


def _with_expiry(postgres_url: str, prefix: str, expires: int) -> bytes:
    """The stored hash of "kept" with its field `z` moved to `expires`."""
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT exact FROM sw_barriers WHERE prefix = %s AND id = 'kept'",
                           (prefix,)).fetchone()
    assert row is not None
    fields = msgspec.msgpack.decode(bytes(row[0]), type=dict[bytes, bytes])
    fields[b"z"] = str(expires).encode()
    return msgspec.msgpack.encode(fields)
