"""Exactly-once across a crash and a restore (issue 38, must-show 2): writers send
`state::update` calls (an increment and an append of the call's own id) with fresh ids to a
`stateworker serve` with the snapshot on; while the snapshot lags behind them the service is
killed (-9) and Redis wiped (FLUSHALL) at the same moment; the service starts again and
repairs Redis from PostgreSQL; then every id ever sent is sent again with its same body.

No acknowledged id is applied twice: in every value each id appears at most once and the
counter equals the ids appended. What the wipe took (the snapshot's lag) is counted exactly:
an acknowledged call whose change PostgreSQL did not hold is either applied again by its retry
(its record was not held either) or answered from its record (`lost`: the record reached
PostgreSQL with a newer change of the batch, while this one was past it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.bus.client import StateClient
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshots import postgres_entries
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

RUNS = 10
WRITERS = 8
KEYS = 4
ACKED_BEFORE_KILL = 400  # acknowledged calls before the kill (the snapshot lags then)
SCOPE = "eo"


def body_of(call_id: str, n: int) -> bytes:
    return msgspec.json.encode({"scope": SCOPE, "key": f"k{n % KEYS}", "ops": [
        {"type": "increment", "path": "n", "by": 1},
        {"type": "append", "path": "ids", "value": call_id}]})


@dataclass
class Run:
    sent: dict[str, bytes] = field(default_factory=dict)  # every id sent, with its body
    acked: dict[str, Any] = field(default_factory=dict)  # id -> its reply (result)
    resent: dict[str, Any] = field(default_factory=dict)  # id -> the reply after the restore


async def writer(client: StateClient, run: Run, tag: str, stop: anyio.Event) -> None:
    n = 0
    while not stop.is_set():
        call_id, n = f"{tag}-{n}", n + 1
        body = body_of(call_id, n)
        run.sent[call_id] = body
        try:
            reply = await client.call_json("state::update", body, call_id=call_id, timeout=3)
        except StateError:  # no answer: it may or may not have been applied
            continue
        run.acked[call_id] = msgspec.json.decode(reply)


LAG_EVENTS = 30  # events of the scope's partition the snapshot has not committed, at the kill


def lagging(client: Any, keys: KeySpace) -> bool:
    part = keys.for_scope(SCOPE)
    done = client.hget(part.snapshotted, "n")
    return done is not None and client.exists(part.events) and \
        client.xinfo_stream(part.events)["entries-added"] - int(done) >= LAG_EVENTS


async def one_run(own_redis: RedisServer, prefix: str, postgres_url: str, number: int
                  ) -> dict[str, int]:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4)
    env = {"STATEWORKER_POSTGRES_URL": postgres_url, "STATEWORKER_LEASE_MS": "1000",
           "STATEWORKER_DISPATCH": "false"}
    service = ServiceProcess(own_redis.url, prefix, env=env)
    redis_client, keys = own_redis.client(), KeySpace(prefix, 4)
    run = Run()
    service.start()
    try:
        async with StateClient(settings=settings) as client:
            for k in range(KEYS):  # (an append to an absent path would make a string)
                await client.call("state::set", {"scope": SCOPE, "key": f"k{k}",
                                                 "value": {"n": 0, "ids": []}})
            # (the keys in PostgreSQL before the writes: the restore brings each back; a
            # loaded machine's snapshot could lag past every write until the kill)
            await until(lambda: len(postgres_entries(postgres_url, prefix)) == KEYS, 30,
                        "the keys in PostgreSQL")
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                for w in range(WRITERS):
                    tg.start_soon(writer, client, run, f"r{number}w{w}", stop)
                await until(lambda: len(run.acked) >= ACKED_BEFORE_KILL
                            and lagging(redis_client, keys), 60, "writes ahead of the snapshot")
                service.kill()  # the service and Redis's data gone at one moment
                redis_client.flushall()
                stop.set()
                # (a call in flight now gets no answer: ended here, not waited out for its
                # 3 s, it is sent and not acknowledged, as a timed out one is)
                tg.cancel_scope.cancel()
        service.start()  # repairs Redis from PostgreSQL before it serves
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            restored_ids: set[str] = set()
            for k in range(KEYS):
                restored_ids |= set((await store.get(SCOPE, f"k{k}"))["ids"])
        async with StateClient(settings=settings) as client:
            limit = anyio.Semaphore(32)

            async def again(call_id: str) -> None:
                async with limit:
                    reply = await client.call_json("state::update", run.sent[call_id],
                                                   call_id=call_id, timeout=30)
                    run.resent[call_id] = msgspec.json.decode(reply)
            async with anyio.create_task_group() as tg:
                for call_id in run.sent:
                    tg.start_soon(again, call_id)
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            values = [(await store.get(SCOPE, f"k{k}")) or {"n": 0, "ids": []}
                      for k in range(KEYS)]
    finally:
        service.kill()
    applied = [call_id for value in values for call_id in value["ids"]]
    present = set(applied)
    assert all(value["n"] == len(value["ids"]) for value in values), [
        (value["n"], len(value["ids"]), len(set(value["ids"]))) for value in values]
    counts = {
        "sent": len(run.sent), "acked": len(run.acked),
        "applied_twice": len(applied) - len(present),
        # acknowledged and held by PostgreSQL: restored, the retry answered from its record
        "restored": sum(1 for i in run.acked if i in restored_ids),
        # acknowledged, its change lost with the wipe (the snapshot's lag), applied by its
        # retry (its record was not held either)
        "applied_again": sum(1 for i in run.acked if i not in restored_ids and i in present),
        # acknowledged, its change lost with the wipe, its retry answered from its record
        "lost": sum(1 for i in run.acked if i not in present)}
    # A retry of a call PostgreSQL held got the very reply it had.
    assert all(run.resent[i] == r for i, r in run.acked.items() if i in restored_ids)
    # Every id sent is applied once now, but those whose record came back without their change.
    assert present == set(run.sent) - {i for i in run.acked if i not in present}
    return counts


async def test_a_restore_after_a_crash_applies_no_acknowledged_call_twice(
        own_redis: RedisServer, postgres_url: str) -> None:
    totals: list[dict[str, int]] = []
    for number in range(RUNS):
        counts = await one_run(own_redis, f"eo{number}x{id(totals) % 10**6}", postgres_url,
                               number)
        print(f"run {number}: {counts}")
        totals.append(counts)
    assert [c["applied_twice"] for c in totals] == [0] * RUNS
    assert sum(c["restored"] for c in totals) > 0  # PostgreSQL held some, and their records
    assert sum(c["applied_again"] + c["lost"] for c in totals) > 0  # the wipe took something
