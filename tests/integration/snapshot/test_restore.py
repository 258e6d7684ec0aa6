"""`stateworker restore`: a flushed Redis rebuilt from the PostgreSQL snapshot holds the
entries and indexes exactly as the scripts wrote them, the triggers and the claims; no
trigger fires for a restored entry, and a new write still fires."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import msgspec
import psycopg
import pytest
import redis

from stateworker import StateClient, StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import CallIdReused
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshots import all_dispatched, calls_saved, caught_up, mixed_writes, nothing_to_reap
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

# What restore rebuilds: entries, their indexes, triggers, claims (by key name part).
RESTORED = (":e:", ":k:", ":u:", ":t:", ":scopes", ":ttl", ":triggers", ":claims")


def dump(client: redis.Redis, prefix: str) -> dict[bytes, Any]:
    """Every restored key of the prefix with its content."""
    found: dict[bytes, Any] = {}
    for name in client.scan_iter(match=f"{prefix}:*", count=1000):
        if not any(part in name.decode(errors="replace") for part in RESTORED):
            continue
        kind = client.type(name)
        found[name] = client.hgetall(name) if kind == b"hash" else client.get(name) \
            if kind == b"string" else client.zrange(name, 0, -1, withscores=True)
    return found


def restore_command(redis_url: str, prefix: str, postgres_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
           "STATEWORKER_POSTGRES_URL": postgres_url}
    return subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", redis_url,
                           "restore"], env=env, capture_output=True, text=True, timeout=120)


async def test_restore_rebuilds_a_flushed_redis(own_redis: RedisServer, prefix: str,
                                                postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    reactor = f"{prefix}:bus:reactor"
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            await store.call("state::register-trigger", {
                "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
                "config": {"scope": "s1"}})
            await store.claim_namespace("billing", ["private"], caller="billing")
            await mixed_writes(store, 3000, seed=7)
            # Names with NUL (PostgreSQL text holds none) and U+FFFF (the escape) round-trip.
            await store.set("nul\0scope", "k\0ey\uffff0", {"v": "\u0000"}, topic="t\uffff",
                            by="writer\0")
            await store.call("state::register-trigger", {
                "id": "t\0nul", "function_id": "reactor::on_change", "service": "reactor",
                "config": {"scope": "nul\0scope"}})
            await store.claim_namespace("billing", ["pri\0vate"], caller="billing")
            await store.barrier({"key": "a\0"}, {"id": "b\0arrier", "expect": 2})
            await until(lambda: caught_up(client, keys) and nothing_to_reap(client, keys, now_ms())
                        and not any(client.scard(p.barriers_changed)
                                    for p in keys.all_partitions()),
                        60, "the snapshot to catch up")

            def registry_copied() -> bool:
                with psycopg.connect(postgres_url) as conn:
                    row = conn.execute("SELECT (SELECT count(*) FROM sw_triggers WHERE prefix = %s)"
                                       " + (SELECT count(*) FROM sw_claims WHERE prefix = %s)",
                                       (prefix, prefix)).fetchone()
                return row is not None and row[0] == 4

            await until(registry_copied, 30, "the triggers and claims in PostgreSQL")
        before = dump(client, prefix)
    assert len(before) > 100

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    entries = sum(1 for name in before if b":e:" in name)
    summary = msgspec.json.decode(done.stdout)
    assert summary["entries"] == entries and summary["triggers"] == 2 and summary["claims"] == 2
    assert summary["barriers"] == 1
    assert f"restored {entries}/{entries} entries" in done.stderr
    assert dump(client, prefix) == before

    # A second restore over what is there now is refused (it does not merge).
    again = restore_command(own_redis.url, prefix, postgres_url)
    refusal = msgspec.json.decode(again.stderr.strip().splitlines()[-1])
    assert again.returncode == 1 and refusal["code"] == "RESTORE_REFUSED"
    assert "already holds entries" in refusal["message"] and refusal["details"] == {
        "prefix": prefix}

    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        await store.set("s1", "after-restore", 1)

        await until(lambda: client.exists(reactor) and all_dispatched(client, keys), 30,
                    "the new write dispatched")
        calls = client.xrange(reactor)
        assert len(calls) == 1 and b"after-restore" in calls[0][1][b"body"]


def keys_of(prefix: str) -> KeySpace:
    return KeySpace(prefix, 4)


def snapshot_claims(postgres_url: str, prefix: str) -> dict[str, str]:
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT scope, namespace FROM sw_claims WHERE prefix = %s",
                            (prefix,)).fetchall()
    return {str(scope): str(namespace) for scope, namespace in rows}


async def test_claims_and_releases_survive_a_restore(own_redis: RedisServer, prefix: str,
                                                     postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client = own_redis.client()
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        await store.claim_namespace("billing", ["kept", "given-back", "to-release-later"])
        for scope in ("kept", "given-back"):
            await store.call("billing::state::compare-and-set",
                             {"scope": scope, "key": "k", "value": scope})
        await until(lambda: len(snapshot_claims(postgres_url, prefix)) == 3, 30,
                    "the claims in PostgreSQL")
        await store.release_namespace(["given-back"], caller="billing")
        await until(lambda: snapshot_claims(postgres_url, prefix) == {
            "kept": "billing", "to-release-later": "billing"}, 30,
            "the release in PostgreSQL")
        await until(lambda: caught_up(client, keys_of(prefix)), 60, "the snapshot to catch up")

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["claims"] == 2

    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store, \
            StateService.running(settings, BusOptions(block_ms=50)):
        assert await store.get("given-back", "k") == "given-back"  # public, entry kept
        assert await store.list_groups() == ["given-back"]
        assert await store.call("billing::state::get", {"scope": "kept", "key": "k"}) == "kept"
        with pytest.raises(StateError) as private:
            await store.get("kept", "k")
        assert private.value.code == "RESERVED_SCOPE"
        # a release after the restore is followed too
        await store.release_namespace(["to-release-later"], caller="billing")
        await until(lambda: snapshot_claims(postgres_url, prefix) == {"kept": "billing"}, 30,
                    "the later release in PostgreSQL")


async def test_a_late_retry_after_a_restore_gets_its_reply_and_is_not_applied_again(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A bus call acknowledged, the snapshot committed past it, Redis wiped and restored:
    the same call id again gets the same reply and changes nothing; reused with another body
    it is CALL_ID_REUSED."""
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    first_body = {"scope": "orders", "key": "o-1", "value": {"n": 1}}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as bus:
        first = await bus.call("state::set", first_body, call_id="late-1")
        later = await bus.call("state::set", {"scope": "orders", "key": "o-1", "value": {"n": 2}},
                               call_id="late-2")
        assert (first["old_value"], first["new_value"], first["version"]) == (None, {"n": 1}, 1)
        assert later["version"] == 2

        await until(lambda: calls_saved(client, keys), 60,
                    "the snapshot and the call records to catch up")

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["calls"] == 2

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as bus:
        assert await bus.call("state::set", first_body, call_id="late-1") == first
        with pytest.raises(CallIdReused):
            await bus.call("state::set", {**first_body, "value": 3}, call_id="late-2")
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            entry = await store.get_entry("orders", "o-1")
            assert entry.found and entry.version == 2 and entry.value == {"n": 2}
            assert await store.events("orders") == []  # the retry wrote no event
