"""Dead consumers removed from a service's consumer group (the sweep: bus/upkeep.py,
sweep.lua, decision 0068), from the attacker's side: every restart left a consumer for good
before; now the group keeps the live ones only. A consumer with calls pending is kept until
the reclaim took them (each answered once); live consumers, removed and made again while
calls flow and sweeps run as often as they can, lose nothing; in `acl` mode the service
sweeps every principal's stream under exactly its rule, and a worker whose Redis user may not
sweep says so once and serves on. The idle bound is an option, 0 here (`idle` counts whole
ms: 1 ms idle is past it), so no test waits for a consumer to age."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app import service_user
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions, Call, reply_document
from stateworker.bus.sources import Sources, swept_consumers
from stateworker.bus.stats import CONSUMERS_REMOVED
from stateworker.bus.worker import Worker
from stateworker.keys import bus_stream, principal_stream, stats_key
from stateworker.scripts.replies import Swept
from stateworker.scripts.upkeep_bindings import bus_library
from stateworker.settings import Settings
from stateworker.state.tenancy import principals
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from tests.integration.acl_users import add_user, refusals
from tests.integration.bus.replies import drained, pop_replies
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SERVICE = "svc"
FN = f"{SERVICE}::echo"
# Sweeps as often as the reclaim rounds come (every half visibility timeout), with a bound of 0.
SWEEPING = {"block_ms": 50, "visibility_timeout_ms": 1000, "dead_consumer_ms": 0}


def echo(worker: Worker) -> list[str]:
    """`svc::echo` on `worker`, answering its body; each run's call id in the list returned."""
    runs: list[str] = []

    @worker.function(FN)
    async def run(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        return body

    return runs


async def send(raw: aredis.Redis, stream: str, ids: Sequence[str], reply: str) -> None:
    for call_id in ids:
        await raw.xadd(stream, {"id": call_id, "fn": FN, "body": msgspec.json.encode(
            {"call": call_id}), "reply": reply})


async def consumers(raw: aredis.Redis, stream: str, group: str = SERVICE) -> dict[str, int]:
    """The group's consumers: name -> entries pending."""
    return {c["name"].decode(): c["pending"] for c in await raw.xinfo_consumers(stream, group)}


async def removed(raw: aredis.Redis, prefix: str, service: str = SERVICE) -> int:
    """The service's count of dead consumers removed (its stats hash: `stateworker status`)."""
    return int(await raw.hget(stats_key(prefix, service), CONSUMERS_REMOVED) or 0)


def answered(documents: list[bytes]) -> list[str]:
    """The call ids of reply documents, each checked a success echoing its own call."""
    replies = [msgspec.json.decode(document) for document in documents]
    assert all(r["ok"] and r["result"] == {"call": r["id"]} for r in replies), replies
    return sorted(r["id"] for r in replies)


async def test_a_worker_restarted_n_times_leaves_only_its_live_consumer(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """Each run a new consumer name (a container's new hostname or pid): N runs, each answering
    a call, leave N consumers; the next run removes exactly those N and never itself."""
    n = 5
    stream, reply = bus_stream(prefix, SERVICE), f"{prefix}:reply:restarts"
    settings = settings_for(redis_server.url, prefix)
    for run in range(n):
        worker = Worker(SERVICE, settings=settings,
                        options=BusOptions(block_ms=50, consumer=f"run-{run}"))
        echo(worker)
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await send(raw, stream, [f"call-{run}"], reply)
            await pop_replies(raw, reply, 1)
            worker.stop()
    assert await consumers(raw, stream) == {f"run-{run}": 0 for run in range(n)}
    live = Worker(SERVICE, settings=settings, options=BusOptions(consumer="live", **SWEEPING))
    runs = echo(live)
    async with anyio.create_task_group() as tg:
        await tg.start(live.run)
        await until(lambda: removed(raw, prefix), 20, "the sweep")
        assert await removed(raw, prefix) == n
        assert await consumers(raw, stream) == {"live": 0}
        await send(raw, stream, ["after"], reply)
        assert answered(await pop_replies(raw, reply, 1)) == ["after"]
        live.stop()
    assert runs == ["after"]


async def test_a_dead_consumers_pending_calls_are_answered_once_before_it_goes(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """A consumer read 20 calls and died: sweeps run from the heir's first round on, but the
    consumer stays until the reclaim (after the visibility timeout) took its calls; each is
    answered once and run once, then the consumer goes."""
    stream, reply = bus_stream(prefix, SERVICE), f"{prefix}:reply:orphans"
    ids = [f"orphan-{i:02d}" for i in range(20)]
    await raw.xgroup_create(stream, SERVICE, id="0", mkstream=True)
    await send(raw, stream, ids, reply)
    (_, read), = await raw.xreadgroup(SERVICE, "dead", {stream: ">"}, count=len(ids))
    assert len(read) == len(ids)
    heir = Worker(SERVICE, settings=settings_for(redis_server.url, prefix),
                  options=BusOptions(consumer="heir", **{**SWEEPING,
                                                         "visibility_timeout_ms": 2000}))
    runs = echo(heir)
    async with anyio.create_task_group() as tg:
        await tg.start(heir.run)
        assert answered(await pop_replies(raw, reply, len(ids))) == ids
        await until(lambda: removed(raw, prefix), 20, "the dead consumer removed")
        assert await consumers(raw, stream) == {"heir": 0}
        await until(lambda: drained(raw, stream, SERVICE), 10, "every entry acknowledged")
        heir.stop()
    assert sorted(runs) == ids
    assert await raw.llen(reply) == 0  # (no second reply to any)
    assert await removed(raw, prefix) == 1


async def test_live_consumers_lose_nothing_while_sweeps_run_as_often_as_they_can(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """A worker and 4 consumers speaking the protocol by hand (each reads one call, answers it,
    acknowledges it) serve 400 calls from 4 callers while the worker and the test itself
    sweep with a bound of 0, the test without pause from 2 connections: a consumer with
    nothing pending between two reads is removed again and again. Every entry a consumer read
    is still pending when it acknowledges it (a removal between a check and a delete would
    have dropped it: XACK 0, and a reader that died then would have lost the call), every call
    is answered once, and a hand removed while it waits in its read is made again by the read
    that gets a call."""
    stream = bus_stream(prefix, SERVICE)
    ids = [f"live-{i:03d}" for i in range(400)]
    hands = [f"hand-{n}" for n in range(4)]
    worker = Worker(SERVICE, settings=settings_for(redis_server.url, prefix),
                    options=BusOptions(consumer="worker", **SWEEPING))
    runs = echo(worker)
    by_hand: list[str] = []
    acked: list[int] = []
    sweeps: list[Swept] = []
    sending = anyio.Event()
    sweepers = [connection_for(redis_server.url) for _ in range(2)]

    async def sweep(conn: RedisConnection) -> Swept:
        (swept,) = await swept_consumers(conn, bus_library(conn), Sources(
            prefix, SERVICE, stream), SERVICE, "sweeper", 0)
        assert isinstance(swept, Swept), swept
        sweeps.append(swept)
        return swept

    async def sweep_on(conn: RedisConnection) -> None:
        while not sending.is_set():
            await sweep(conn)

    async def hand(name: str) -> None:
        reader = aredis.Redis(port=redis_server.port)
        try:
            while True:
                for _, entries in await reader.xreadgroup(SERVICE, name, {stream: ">"},
                                                          count=1, block=50) or []:
                    for entry_id, fields in entries:
                        call_id = fields[b"id"].decode()
                        by_hand.append(call_id)
                        await reader.lpush(fields[b"reply"], reply_document(
                            call_id, msgspec.json.encode({"call": call_id}), None))
                        acked.append(await reader.xack(stream, SERVICE, entry_id))
                        await reader.xdel(stream, entry_id)
        finally:
            await reader.aclose()

    async def call(call_id: str) -> bytes:
        reply = f"{prefix}:reply:{call_id}"
        await send(raw, stream, [call_id], reply)
        (document,) = await pop_replies(raw, reply, 1)
        return document

    documents: list[bytes] = []

    async def caller(mine: list[str]) -> None:
        for call_id in mine:
            documents.append(await call(call_id))

    async def hand_removed() -> bool:
        await sweep(sweepers[0])
        return hands[0] not in await consumers(raw, stream)

    try:
        async with anyio.create_task_group() as tg:
            for name in hands:
                tg.start_soon(hand, name)
            async with anyio.create_task_group() as serving:
                await serving.start(worker.run)
                for conn in sweepers:
                    serving.start_soon(sweep_on, conn)
                # (the worker's consumer, made by its first read, is removed before any call)
                await until(lambda: any(s.removed for s in sweeps), 10, "a removal")
                async with anyio.create_task_group() as calling:
                    for n in range(4):
                        calling.start_soon(caller, ids[n::4])
                sending.set()
                worker.stop()
            await until(lambda: len(acked) == len(by_hand), 10, "the hands' acknowledgements")
            assert answered(documents) == ids
            assert sorted(runs + by_hand) == ids and not set(runs) & set(by_hand)
            assert by_hand and acked == [1] * len(by_hand)
            tg.cancel_scope.cancel()
        # One hand alone reads now: removed while it waits, the call it gets makes it again.
        async with anyio.create_task_group() as tg:
            tg.start_soon(hand, hands[0])
            await until(hand_removed, 10, "the hand removed while it waits")
            assert answered([await call("after")]) == ["after"]
            await until(lambda: len(acked) == len(by_hand), 10, "the hand's acknowledgement")
            assert by_hand[-1] == "after" and acked[-1] == 1
            assert hands[0] in await consumers(raw, stream)
            tg.cancel_scope.cancel()
    finally:
        for conn in sweepers:
            await conn.close()


async def test_in_acl_mode_the_service_sweeps_every_principals_stream_under_its_rule(
        acl_redis: RedisServer, prefix: str) -> None:
    """The service, under exactly its Redis user's rule (docs/security.md), removes the dead
    consumers of its shared stream and of a principal's stream; Redis refused it nothing."""
    url = add_user(acl_redis, "svc-sweep", service_user.rule(prefix))
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, auth="acl")
    admin = aredis.Redis(port=acl_redis.port)
    with acl_redis.client() as raw:
        raw.execute_command("ACL", "LOG", "RESET")
    try:
        async with StateService.running(settings, BusOptions(**SWEEPING)) as service:
            await principals.add_principal(service.state, "p-sweep", ["writer"], [])
            theirs = principal_stream(prefix, "state", "p-sweep")
            shared = bus_stream(prefix, "state")
            dead = [f"gone-{n}" for n in range(3)]
            for stream in (theirs, shared):
                for name in dead:
                    await admin.execute_command("XGROUP", "CREATECONSUMER", stream, "state",
                                                name)
            mine = {service.runtime.consumer: 0}

            async def swept() -> bool:
                return (await consumers(admin, theirs, "state") == mine
                        and await consumers(admin, shared, "state") == mine)

            await until(swept, 20, "both streams' dead consumers removed")
            await until(lambda: removed(admin, prefix, "state"), 10, "the count")
            assert await removed(admin, prefix, "state") == 2 * len(dead)
    finally:
        await admin.aclose()
    assert refusals(acl_redis) == []


async def test_a_worker_whose_user_may_not_sweep_says_so_once_and_serves_on(
        acl_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    """A user worker's Redis user is the operator's to make (docs/security.md): one without
    `+xgroup|delconsumer` gets one warning naming what the sweep needs, and no more tries:
    later rounds (a dead consumer's call taken over, so rounds did pass) say nothing more."""
    caplog.set_level(logging.INFO, logger="stateworker.bus")
    url = add_user(acl_redis, "worker-no-sweep", ["on", f"~{prefix}:*", "+@all",
                                                  "-xgroup|delconsumer"])
    stream, reply = bus_stream(prefix, SERVICE), f"{prefix}:reply:{uuid.uuid4().hex}"
    admin = aredis.Redis(port=acl_redis.port)
    worker = Worker(SERVICE, settings=Settings(redis_url=url, prefix=prefix, partitions=4),
                    options=BusOptions(consumer="limited", **SWEEPING))
    runs = echo(worker)

    def said(event: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if getattr(r, "event", "") == event]

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await admin.execute_command("XGROUP", "CREATECONSUMER", stream, SERVICE, "gone")
            await until(lambda: said("bus.sweep_refused"), 20, "the refusal said")
            # A call read by a consumer that died, in one transaction (the worker, waiting in
            # its read, would get it first), taken over only a visibility timeout later.
            async with admin.pipeline(transaction=True) as pipe:
                pipe.xadd(stream, {"id": "orphan", "fn": FN, "reply": reply,
                                   "body": msgspec.json.encode({"call": "orphan"})})
                pipe.xreadgroup(SERVICE, "dead", {stream: ">"}, count=1)
                _, read = await pipe.execute()
            assert read[0][1][0][1][b"id"] == b"orphan"
            assert answered(await pop_replies(admin, reply, 1)) == ["orphan"]
            await send(admin, stream, ["served"], reply)
            assert answered(await pop_replies(admin, reply, 1)) == ["served"]
            worker.stop()
        assert runs == ["orphan", "served"]
        assert len(said("bus.sweep_refused")) == 1 and said("bus.sweep_failed") == []
        assert "+xgroup|delconsumer" in said("bus.sweep_refused")[0]
        assert "gone" in await consumers(admin, stream)
    finally:
        await admin.aclose()
