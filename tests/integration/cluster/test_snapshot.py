"""The PostgreSQL snapshot and `stateworker restore` on one server and on the 3+3 cluster: the
writes of scopes spread over every partition (so every primary of the cluster) reach
PostgreSQL exactly, and a restore into an empty target gives back exactly what Redis held.
And the move a user makes when one server is outgrown: snapshot one server, restore into the
cluster, every entry served there.

What Redis holds is read with redis-py, node by node (each primary's own SCAN), independently
of the project's routing."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import psycopg
import pytest
import redis
from redis.cluster import RedisCluster as RedisClusterClient

from stateworker import StateClient, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, call_field
from stateworker.settings import Settings
from stateworker.snapshot.names import from_pg
from stateworker.state.kv.packed import unpack
from stateworker.transport.slots import SLOTS, key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until
from tests.integration.cluster.clients import keyed_client
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 8
SCOPES = [f"s{n}" for n in range(24)]
KEYS = [f"k{n}" for n in range(6)]
# What restore rebuilds (by key name part): entries, their indexes, barriers, the registry.
ENTRIES = len(SCOPES) * (len(KEYS) - 1) + 2  # (k5 deleted; two written over the bus)
RESTORED = (":e:", ":k:", ":u:", ":t:", ":scopes", ":ttl", ":b:", ":triggers", ":claims")


def spread_prefix(primary_of: Callable[[int], int]) -> str:
    """A fresh prefix whose partitions land on every primary (`primary_of(slot)`)."""
    primaries = {primary_of(slot) for slot in (0, SLOTS // 2, SLOTS - 1)}
    while True:
        prefix = f"t{uuid.uuid4().hex[:12]}"
        keys = KeySpace(prefix, PARTITIONS)
        if {primary_of(key_slot(keys.partition(n).tag)) for n in range(PARTITIONS)} == primaries:
            return prefix


def nodes_of(where: str, request: pytest.FixtureRequest) -> list[redis.Redis]:
    """A redis-py client per primary (one: the server)."""
    if where == "one":
        server: RedisServer = request.getfixturevalue("redis_server")
        return [server.client()]
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return [cluster.client(node.port) for node in cluster.primaries()]


def primary_of(where: str, request: pytest.FixtureRequest) -> Callable[[int], int]:
    if where == "one":
        return lambda slot: slot * 3 // SLOTS  # (one server: any split will do)
    cluster: RedisCluster = request.getfixturevalue("redis_cluster")
    return lambda slot: cluster.owner(slot).port


def dump(nodes: list[redis.Redis], prefix: str) -> dict[bytes, Any]:
    """Every key of the prefix restore rebuilds, with its content, from every node."""
    found: dict[bytes, Any] = {}
    for node in nodes:
        for name in node.scan_iter(match=f"{prefix}:*", count=1000):
            if not any(part in name.decode(errors="replace") for part in RESTORED):
                continue
            kind = node.type(name)
            found[name] = node.hgetall(name) if kind == b"hash" else node.get(name) \
                if kind == b"string" else node.zrange(name, 0, -1, withscores=True)
    return found


def entries_in(dumped: dict[bytes, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(scope, key) -> (value text, version, hash, topic, expires, revision) of each entry."""
    found: dict[tuple[str, str], tuple[Any, ...]] = {}
    for name, stored in dumped.items():
        _, sep, member = name.partition(b"}:e:")
        if not sep:
            continue
        length, _, rest = member.partition(b":")
        scope, key = rest[:int(length)].decode(), rest[int(length):].decode()
        e = unpack(stored)
        found[(scope, key)] = (e.value.decode(), e.version, e.hash, e.topic, e.expires,
                               "{}-{}".format(*e.revision))
    return found


def postgres_entries(url: str, prefix: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT scope, key, value_text, version, hash, topic, expires_ms, revision_ms, "
            "revision_seq FROM sw_entries WHERE prefix = %s", (prefix,)).fetchall()
    return {(from_pg(r[0]), from_pg(r[1])): (r[2], r[3], r[4], from_pg(r[5]), r[6],
                                             f"{r[7]}-{r[8]}") for r in rows}


def postgres_rest(url: str, prefix: str) -> dict[str, Any]:
    """The barriers (their exact hashes), triggers and claims PostgreSQL holds."""
    with psycopg.connect(url) as conn:
        barriers = conn.execute("SELECT id, exact FROM sw_barriers WHERE prefix = %s",
                                (prefix,)).fetchall()
        triggers = conn.execute("SELECT id, registration FROM sw_triggers WHERE prefix = %s",
                                (prefix,)).fetchall()
        claims = conn.execute("SELECT scope, namespace FROM sw_claims WHERE prefix = %s",
                              (prefix,)).fetchall()
    return {"barriers": {from_pg(i): msgspec.msgpack.decode(bytes(e), type=dict[bytes, bytes])
                         for i, e in barriers},
            "triggers": {from_pg(i): r for i, r in triggers},
            "claims": {from_pg(s): from_pg(n) for s, n in claims}}


def redis_rest(dumped: dict[bytes, Any], keys: KeySpace) -> dict[str, Any]:
    """The same, as Redis holds them."""
    def texts(name: str) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in dumped.get(name.encode(), {}).items()}

    barriers = {name.partition(b"}:b:")[2].decode(): fields for name, fields in dumped.items()
                if b"}:b:" in name}
    return {"barriers": barriers, "triggers": texts(keys.triggers), "claims": texts(keys.claims)}


def caught_up(client: redis.Redis | RedisClusterClient, keys: KeySpace) -> bool:
    """Every partition's snapshot position (mirrored in Redis) at its stream's end, and no
    barrier change or bus call record left unstored."""
    for part in keys.all_partitions():
        added = client.xinfo_stream(part.events)["entries-added"] \
            if client.exists(part.events) else 0
        if int(client.hget(part.snapshotted, "n") or -1) != added or \
                client.scard(part.barriers_changed) or client.xlen(part.unsaved_calls) or \
                client.xlen(part.unsaved_kept):
            return False
    return True


def registry_copied(postgres_url: str, prefix: str, triggers: int, claims: int) -> bool:
    rest = postgres_rest(postgres_url, prefix)
    return (len(rest["triggers"]), len(rest["claims"])) == (triggers, claims)


def wipe(nodes: list[redis.Redis], prefix: str) -> int:
    """Delete every key of the prefix (an empty target for the restore); how many."""
    deleted = 0
    for node in nodes:
        for name in list(node.scan_iter(match=f"{prefix}:*", count=1000)):
            deleted += node.delete(name)
    return deleted


def restore_command(redis_url: str, prefix: str, postgres_url: str) -> dict[str, Any]:
    """`stateworker restore` on `redis_url` (a cluster: its seed list); its summary."""
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": str(PARTITIONS),
           "STATEWORKER_POSTGRES_URL": postgres_url}
    done = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", redis_url,
                           "restore"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = msgspec.json.decode(done.stdout)
    return summary


async def set_everywhere(store: StateStore) -> None:
    """Sets (some with a topic, some with a long expiry) on scopes in every partition."""
    for scope in SCOPES:
        for n, key in enumerate(KEYS):
            await store.set(scope, key, {"n": n, "text": f"é{scope}"},
                            topic="red" if n % 2 else None, ttl_ms=3_600_000 if n == 1 else None)


async def change_everywhere(store: StateStore) -> None:
    """Updates, topic changes and deletes on scopes in every partition; barriers; a trigger
    and a claim."""
    for scope in SCOPES:
        await store.call("state::update", {"scope": scope, "key": "k0", "ops": [
            {"type": "set", "path": "n", "value": 100}]})
        await store.call("state::update-topic", {"scope": scope, "key": "k2", "topic": "green"})
        await store.delete(scope, "k5")
    for n in range(PARTITIONS):
        await store.call("state::barrier", {"event": {"key": "a"},
                                            "condition_config": {"id": f"b{n}", "expect": 2}})
    await store.call("state::register-trigger", {
        "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": SCOPES[0]}})
    await store.claim_namespace("billing", ["private"], caller="billing")


@pytest.fixture
def spread(where: str, request: pytest.FixtureRequest) -> str:
    """The test's prefix: its partitions on every primary."""
    return spread_prefix(primary_of(where, request))


# Bus calls whose records the snapshot stores: a retry after the restore gets its reply. On
# a cluster the first's id is bound at its home (keys.id_home: partition 4), away from its
# record; the second's home is its scope's partition (0), where its record binds it.
BUS_CALL = {"scope": SCOPES[1], "key": "by-bus", "value": {"n": 1}}
BUS_CALL_ID = "late-1"
HOME_CALL = {"scope": SCOPES[1], "key": "by-bus-at-home", "value": {"n": 2}}
HOME_CALL_ID = "late-10"
# A write that runs no entry script (it changes nothing here): its kept reply goes to
# PostgreSQL from its id's home partition (decision 0061), and comes back with the restore.
STEP_CALL = {"id": "never-begun"}
STEP_CALL_ID = "late-step"


async def snapshot_of(settings: Settings, client: redis.Redis | RedisClusterClient
                      ) -> dict[str, Any]:
    """Write everywhere, until PostgreSQL has it all; the reply to BUS_CALL. The sets come
    before the service starts (the snapshot's first round finds them with a rescan of each
    partition), the changes while it runs (it follows the event streams)."""
    keys = KeySpace(settings.prefix, PARTITIONS)
    async with StateStore.open(settings.redis_url or "", prefix=settings.prefix,
                               partitions=PARTITIONS) as store:
        await set_everywhere(store)
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings, timeout=30) as bus:
            await change_everywhere(store)
            reply: dict[str, Any] = await bus.call("state::set", BUS_CALL, call_id=BUS_CALL_ID)
            assert (await bus.call("state::set", HOME_CALL, call_id=HOME_CALL_ID))["version"] == 1
            assert await bus.call("state::delete-barrier", STEP_CALL,
                                  call_id=STEP_CALL_ID) == {"deleted": False}
            await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
            await until(lambda: registry_copied(settings.postgres_url or "", settings.prefix, 1,
                                                1), 30, "the trigger and the claim in PostgreSQL")
    assert {keys.partition_of(s) for s in SCOPES} == set(range(PARTITIONS))
    return reply



async def test_snapshot_and_restore(where: str, url: str, spread: str, postgres_url: str,
                                    request: pytest.FixtureRequest) -> None:
    prefix, nodes = spread, nodes_of(where, request)
    keys = KeySpace(prefix, PARTITIONS)
    settings = Settings(redis_url=url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client = keyed_client(where, request)
    home, away = (keys.id_home(call_field(i)) for i in (HOME_CALL_ID, BUS_CALL_ID))
    assert home == keys.partition_of(SCOPES[1]) != away  # (both ways of binding an id)
    first = await snapshot_of(settings, client)
    before = dump(nodes, prefix)
    entries = entries_in(before)
    assert len(entries) == ENTRIES
    assert postgres_entries(postgres_url, prefix) == entries  # values, versions, revisions
    assert {v[1] for v in entries.values()} == {1, 2}  # (k0 updated: version 2)
    assert postgres_rest(postgres_url, prefix) == redis_rest(before, keys)
    assert len(redis_rest(before, keys)["barriers"]) == PARTITIONS

    assert wipe(nodes, prefix) > len(entries)
    summary = restore_command(url, prefix, postgres_url)
    assert (summary["entries"], summary["barriers"], summary["triggers"], summary["claims"],
            summary["calls"]) == (len(entries), PARTITIONS, 1, 1, 3)
    assert dump(nodes, prefix) == before
    # No event: the streams are there only to give ids past the revisions restored.
    assert not any(client.xlen(p.events) for p in keys.all_partitions())

    # A late retry of the bus call is answered from its restored record, not applied again.
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as bus:
        assert await bus.call("state::set", BUS_CALL, call_id=BUS_CALL_ID) == first
        assert (await bus.call("state::set", HOME_CALL, call_id=HOME_CALL_ID))["version"] == 1
        assert await bus.call("state::delete-barrier", STEP_CALL,
                              call_id=STEP_CALL_ID) == {"deleted": False}
    # The restored state serves: versions go on from the restored ones, revisions past them
    # (one event per scope: the write below; the retry wrote none).
    async with StateStore.open(url, prefix=prefix, partitions=PARTITIONS) as store:
        for scope in SCOPES:
            entry = await store.get_entry(scope, "k0")
            assert (entry.value, entry.version) == ({"n": 100, "text": f"é{scope}"}, 2)
            await store.set(scope, "k0", "after")
            (event,) = await store.events(scope)
            assert (await store.get_entry(scope, "k0")).version == 3
            assert _revision(event.revision) > _revision(entries[(scope, "k0")][5])


def _revision(text: str) -> tuple[int, int]:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq)


@pytest.fixture
def migration_prefix(redis_cluster: RedisCluster) -> Iterator[str]:
    yield spread_prefix(lambda slot: redis_cluster.owner(slot).port)


@pytest.mark.parametrize("how", ["restore", "repair"])
async def test_one_server_outgrown_moved_into_the_cluster(
        redis_server: RedisServer, redis_cluster: RedisCluster, migration_prefix: str,
        postgres_url: str, how: str) -> None:
    """Snapshot one server, then into the empty cluster: with `stateworker restore`, or by the
    repair at start of the service pointed at it. Every entry is there, served by the service
    on the cluster; barriers, the trigger, the claim and a bus call's record too."""
    prefix, keys = migration_prefix, KeySpace(migration_prefix, PARTITIONS)
    one = Settings(redis_url=redis_server.url, prefix=prefix, partitions=PARTITIONS,
                   postgres_url=postgres_url, lease_ms=1000)
    first = await snapshot_of(one, redis_server.client())
    was = dump([redis_server.client()], prefix)
    held = entries_in(was)
    assert len(held) == ENTRIES

    if how == "restore":
        assert restore_command(redis_cluster.urls, prefix, postgres_url)["entries"] == ENTRIES
    on_cluster = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=PARTITIONS,
                          postgres_url=postgres_url, lease_ms=1000)
    primaries = [redis_cluster.client(node.port) for node in redis_cluster.primaries()]
    async with StateService.running(on_cluster, BusOptions(block_ms=50)), \
            StateClient(settings=on_cluster, timeout=30) as client:
        now = dump(primaries, prefix)
        assert entries_in(now) == held
        assert redis_rest(now, keys) == redis_rest(was, keys)
        for (scope, key), (text, version, *_) in sorted(held.items()):
            got = await client.call("state::get", {"scope": scope, "key": key})
            assert msgspec.json.encode(got) == msgspec.json.encode(msgspec.json.decode(text))
            assert version == (2 if key == "k0" else 1)
        listed = await client.call("state::list_groups", {})
        assert listed == {"groups": sorted(SCOPES)}
        assert await client.call("state::set", BUS_CALL, call_id=BUS_CALL_ID) == first
