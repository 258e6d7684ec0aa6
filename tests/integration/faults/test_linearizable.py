"""Linearizability under kill -9 (issue 38): 8 clients call get, set and compare-and-set (on
the version and on the value) on 4 registers over the bus, in `strict`, while redis-server,
a cluster primary or the service is killed -9 and started again, or Redis is wiped and
rebuilt from PostgreSQL; each register's whole history must be linearizable
(tests/linearizability.py, which tests/unit/test_linearizability.py holds to stale reads and
lost writes). Ops that got no answer may have taken effect or not; the checker allows both.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until
from tests.integration.cluster.writers import scopes_in
from tests.integration.faults.registers import Clients
from tests.integration.snapshots import caught_up
from tests.linearizability import check
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

CLIENTS = 8
STRICT = {"STATEWORKER_DURABILITY": "strict", "STATEWORKER_LEASE_MS": "1000"}
PHASE = 300  # answered ops before the first fault, and after each recovery


def registers(scopes: list[str]) -> list[tuple[str, str]]:
    return [(scope, key) for scope in scopes for key in ("k0", "k1")]


def judge(clients: Clients, faults: Counter[str], phases: int, what: str) -> None:
    """The history is linearizable, and it is one worth checking: ops answered and not, on
    every register, of every kind, through the faults (`phases`: the runs of PHASE answered
    ops waited for)."""
    result = check(clients.history)
    writes, applied = clients.unanswered_writes()
    print(f"{what}: {len(clients.history)} ops, {clients.summary()}; {writes} writes without "
          f"an answer, {applied} of them seen applied; faults {dict(faults)}")
    assert result.ok, str(result)
    assert clients.answered >= PHASE * phases
    assert clients.unanswered + clients.not_sent > 0  # the faults met calls in flight
    per_register = Counter(op.key for op in clients.history if op.output is not None)
    assert len(per_register) == len(clients.registers), per_register
    kinds = Counter(op.kind for op in clients.history if op.output is not None)
    assert set(kinds) == {"get", "set", "cas", "swap"}, kinds
    refused = sum(op.output is not None and op.output[0] in ("conflict", "current")
                  for op in clients.history)
    assert refused > 0  # compare-and-sets lost races too


async def test_one_redis_and_the_service_killed_9_twice_each(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    service = ServiceProcess(server.url, prefix, env=STRICT)
    clients = Clients(Settings(redis_url=server.url, prefix=prefix, partitions=4),
                      registers(["lin-a", "lin-b"]), CLIENTS, seed=1)
    faults: Counter[str] = Counter()
    try:
        await anyio.to_thread.run_sync(service.start)
        async with anyio.create_task_group() as tg:
            clients.start(tg)
            await clients.opened_all()
            await clients.progress(PHASE, 60, "before the faults ")
            for fault in ("redis-server", "service", "redis-server", "service"):
                down, back = (server.kill, server.start) if fault == "redis-server" \
                    else (service.kill, service.start)
                await anyio.to_thread.run_sync(down)  # kill -9, the clients calling on
                faults[fault] += 1
                await clients.an_op_unanswered(20, f"with the {fault} down ")
                await anyio.to_thread.run_sync(back)  # same port, same AOF
                await clients.progress(PHASE, 60, f"after the {fault} came back ")
            clients.stop()
    finally:
        service.kill()
        server.kill()
    judge(clients, faults, 5, "one redis")


@pytest.fixture(scope="module")
def strict_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A cluster of the module's own: strict needs `appendfsync always` on every node."""
    cluster = RedisCluster(tmp_path_factory.mktemp("strict"), appendfsync="always")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill()


async def test_a_cluster_primary_killed_9_while_its_replica_lags(strict_cluster: RedisCluster,
                                                                 prefix: str) -> None:
    """Half the registers on the partition whose primary is killed. Its replica is stopped
    first (SIGSTOP): from then on no batch is confirmed by strict's WAIT 1, so the calls in
    flight when the primary dies get no answer (applied or not: the replica may or may not
    have read them). Then the replica runs again and is promoted, and the killed node comes
    back as its replica."""
    keys = KeySpace(prefix, 4)
    scopes = scopes_in(keys, 1, 1) + [s for s in (f"o{n}" for n in range(40))
                                      if keys.partition_of(s) != 1][:1]
    env = {**STRICT, "STATEWORKER_BUS_SHARDS": "3"}
    slot = key_slot(keys.partition(1).tag)
    service = ServiceProcess(strict_cluster.urls, prefix, env=env)
    settings = Settings(redis_url=strict_cluster.urls, prefix=prefix, partitions=4, bus_shards=3)
    clients = Clients(settings, registers(scopes), CLIENTS, seed=2)
    faults: Counter[str] = Counter()
    try:
        await anyio.to_thread.run_sync(service.start)
        async with anyio.create_task_group() as tg:
            clients.start(tg)
            await clients.opened_all()
            await clients.progress(PHASE, 60, "before the faults ")
            victim = strict_cluster.owner(slot)
            replica = next(n for n in strict_cluster.replicas() if n.slots == victim.slots)
            os.kill(replica.pid, signal.SIGSTOP)
            faults["replica stopped"] += 1
            try:
                await clients.an_op_unanswered(20, "with the replica stopped ")
                strict_cluster.kill_node(victim.port)
                faults["primary killed"] += 1
            finally:
                os.kill(replica.pid, signal.SIGCONT)
            await anyio.to_thread.run_sync(strict_cluster.promoted, slot, victim.port)
            await anyio.to_thread.run_sync(strict_cluster.restart_node, victim.port)
            await clients.progress(PHASE, 60, "after the failover ")
            await clients.no_send_rerouted(40)
            clients.stop()
    finally:
        service.kill()
    assert strict_cluster.owner(slot).port == replica.port
    judge(clients, faults, 2, "cluster")


async def test_across_a_crash_and_a_restore_from_postgres(tmp_path: Path, prefix: str,
                                                          postgres_url: str) -> None:
    """The service killed -9 under load; once the snapshot holds every write, killed again
    and Redis wiped (FLUSHALL); the service started on the empty Redis rebuilds it from
    PostgreSQL (the repair at start) and the clients go on: one history across it all.

    It relies on: the repair at start seeing a flushed Redis as new (no meta key) and
    restoring every entry with its version before the "serving" line; versions going on from
    the restored ones; `caught_up` (the snapshot's positions mirrored in Redis at the streams'
    ends) meaning PostgreSQL holds every applied write; and a call never starting after its
    deadline (the calls in flight at the crash are past theirs before the restart, so none is
    applied after the snapshot caught up)."""
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    service = ServiceProcess(server.url, prefix,
                             env={**STRICT, "STATEWORKER_POSTGRES_URL": postgres_url})
    clients = Clients(Settings(redis_url=server.url, prefix=prefix, partitions=4),
                      registers(["lin-a", "lin-b"]), CLIENTS, seed=3)
    faults: Counter[str] = Counter()
    redis = server.client()
    try:
        await anyio.to_thread.run_sync(service.start)
        async with anyio.create_task_group() as tg:
            clients.start(tg)
            await clients.opened_all()
            await clients.progress(PHASE, 60, "before the crash ")
            # Stopped first, so that the calls made meanwhile are in flight at the kill.
            await anyio.to_thread.run_sync(service.freeze)
            await clients.an_op_started(10, "with the service stopped ")
            service.kill()
            faults["service"] += 1
            clients.pause()  # no new op; those in flight time out (no service to answer)
            await clients.idle(20)  # (and so their deadlines have passed)
            await anyio.to_thread.run_sync(service.start)
            keys = KeySpace(prefix, 4)
            await until(lambda: caught_up(redis, keys), 60, "the snapshot to catch up")
            service.kill()
            redis.flushall()  # the wipe: what Redis held is only in PostgreSQL now
            faults["wipe"] += 1
            await anyio.to_thread.run_sync(service.start)  # repairs Redis before serving
            clients.resume()
            await clients.progress(2 * PHASE, 60, "after the restore ")
            clients.stop()
    finally:
        service.kill()
        server.kill()
        redis.close()
    judge(clients, faults, 3, "restore")
