"""One primary of the 3+3 cluster that comes back without the prefix's data (issue 38) is
found by itself: writes to the partitions it serves are refused (STORE_LOST), the others go
on, and PostgreSQL keeps every row of it through several snapshot rounds; `status` names the
partitions; the documented recovery (the prefix's keys deleted, then `stateworker restore`)
brings every entry back with its version."""

from __future__ import annotations

import psycopg
import pytest
import redis

from stateworker import StateError, StateStore
from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state import generation
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until
from tests.integration.cluster.test_snapshot import (
    PARTITIONS,
    SCOPES,
    caught_up,
    restore_command,
    spread_prefix,
    wipe,
)

pytestmark = pytest.mark.anyio


def rows(url: str, prefix: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT scope, key, value_text, version FROM sw_entries WHERE "
                            "prefix = %s ORDER BY scope, key", (prefix,)).fetchall()


async def test_a_primary_that_comes_back_empty_is_found_by_itself(
        redis_cluster: RedisCluster, postgres_url: str) -> None:
    prefix = spread_prefix(lambda slot: redis_cluster.owner(slot).port)
    keys = KeySpace(prefix, PARTITIONS)
    settings = Settings(redis_url=redis_cluster.urls, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client = redis.cluster.RedisCluster(host="127.0.0.1",
                                        port=redis_cluster.primaries()[0].port)
    victim = redis_cluster.primaries()[1]
    on_victim = {n for n in range(PARTITIONS)
                 if redis_cluster.owner(key_slot(keys.partition(n).tag)).port == victim.port}
    lost_scopes = [s for s in SCOPES if keys.partition_of(s) in on_victim]
    kept_scopes = [s for s in SCOPES if keys.partition_of(s) not in on_victim]
    assert lost_scopes and kept_scopes
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store:
        for scope in SCOPES:
            await store.set(scope, "k", 1)
            await store.set(scope, "k", 2)
        await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
        truth = rows(postgres_url, prefix)
        assert len(truth) == len(SCOPES)
        wipe([redis_cluster.client(victim.port)], prefix)  # (that node lost the prefix's data)
        await until(lambda: service.state.lost is not None, 30, "the service to see it lost")
        seen: set[bytes] = set()

        def rounds() -> bool:
            at = client.hget(keys.snapshot_status, generation.SEEN_FIELD)
            seen.update([at] if at else [])
            return len(seen) >= 3
        await until(rounds, 30, "two snapshot rounds on the lost node")
        assert rows(postgres_url, prefix) == truth
        refused = 0
        for scope in lost_scopes:
            with pytest.raises(StateError) as caught:
                await store.set(scope, "k", 3)
            refused += caught.value.code == "STORE_LOST"
        assert refused == len(lost_scopes)
        for scope in kept_scopes:  # the other primaries' partitions go on
            assert (await store.set(scope, "k", 3)).version == 3
        report = (await status_report(settings))["store_lost"]
        assert all(f"partition {n}" in report for n in on_victim)
        assert not any(f"partition {n}," in report or report.endswith(f"partition {n}")
                       for n in set(range(PARTITIONS)) - on_victim)
        # The recovery: the prefix's keys gone everywhere, then the restore.
        await until(lambda: caught_up_kept(client, keys, on_victim), 60,
                    "the snapshot of the other partitions")
        wipe([redis_cluster.client(node.port) for node in redis_cluster.primaries()], prefix)
        summary = restore_command(redis_cluster.urls, prefix, postgres_url)
        assert summary["entries"] == len(SCOPES)
        await until(lambda: service.state.lost is None, 30, "the service to see it recovered")
        for scope in lost_scopes:
            assert (await store.set(scope, "k", 4)).version == 3
        for scope in kept_scopes:
            assert (await store.set(scope, "k", 4)).version == 4


def caught_up_kept(client: redis.cluster.RedisCluster, keys: KeySpace, lost: set[int]) -> bool:
    for n in set(range(keys.partitions)) - lost:
        part = keys.partition(n)
        done = client.hget(part.snapshotted, "n")
        if done is None or int(done) != client.xinfo_stream(part.events)["entries-added"]:
            return False
    return True
