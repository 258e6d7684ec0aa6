"""Promises of the bus runtime that the README and docs/decisions/ make: exactly once
when a call is delivered twice at once (the visibility timeout), Redis lost in the middle of a
batch, and the dedupe window of the call records (the state service's and a user worker's).

Faults come from real processes and sockets: `FaultProxy` (tests/servers.py) holds or mutes
one connection of an in-process service."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateStore, Worker
from stateworker.app.service import StateService
from stateworker.bus.entries import call_digest
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.clock import now_ms
from stateworker.errors import InvalidRequest, StateError
from stateworker.keys import KeySpace, call_field
from tests.calls import INCREMENT
from tests.integration.bus.replies import assert_increments_once, drained, pop_replies
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.records import record_of, slice_ms
from tests.servers import FaultProxy, RedisServer

pytestmark = pytest.mark.anyio


def increment(scope: str, key: str = "counter") -> bytes:
    return msgspec.json.encode({"scope": scope, "key": key, "ops": INCREMENT})


async def redis_ms(raw: aredis.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def reading_blocked(raw: aredis.Redis) -> bool:
    """A client of this server waits in a blocking XREADGROUP."""
    return any(c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in await raw.client_list())


def counted(worker: Worker, fn: str, answer: Callable[[Any, int], Any]) -> list[str]:
    """`fn` on `worker`: each run's call id recorded in the list returned, its reply
    `answer(body, runs so far)`."""
    runs: list[str] = []

    @worker.function(fn)
    async def run(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        return answer(body, len(runs))

    return runs


# ---- two consumers, one call -----------------------------------------------------------------


async def test_a_call_in_flight_is_kept_until_the_visibility_timeout_and_applied_once(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """Consumer A reads a call and is slow with it (its requests are held on the way to
    Redis). Meanwhile the same call id is delivered again, to consumer B, which applies it;
    B also takes A's entry over - but only once it was idle for B's visibility timeout - and
    answers it from the record. When A's requests finally arrive, A answers from the record
    too. Three deliveries, two consumers running the same call at once: applied once, one
    reply."""
    stream, group = f"{prefix}:bus:state", "state"
    call_id = f"dup-{uuid.uuid4().hex}"
    first, second = f"{prefix}:reply:first", f"{prefix}:reply:second"
    visibility_ms = 1000  # B's
    proxy = FaultProxy(redis_server.port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        proxy.arm("hold", call_id.encode())
        slow = StateService.running(settings_for(proxy.url, prefix), BusOptions(
            block_ms=50, concurrency=1, visibility_timeout_ms=60_000, consumer="A"))
        async with slow:
            entry = await raw.xadd(stream, {"id": call_id, "fn": "state::update",
                                            "body": increment(scope), "reply": first})
            with anyio.fail_after(10):
                await proxy.triggered.wait()  # A read the call; its requests are held
            async with raw.pipeline(transaction=True) as pipe:
                pipe.xpending_range(stream, group, "-", "+", 10)
                pipe.time()
                pending, (seconds, micros) = await pipe.execute()
            assert [(p["message_id"], p["consumer"]) for p in pending] == [(entry, b"A")]
            delivered_ms = int(seconds) * 1000 + int(micros) // 1000 - pending[0][
                "time_since_delivered"]
            assert proxy.held_bytes > 0
            fast = StateService.running(settings_for(redis_server.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=visibility_ms, consumer="B"))
            async with fast:
                # B waits in its blocking read first: A, its one slot busy, reads ahead
                # without blocking and would take an entry nobody waits for (a fourth
                # delivery, so a second reply to `second`).
                await until(lambda: reading_blocked(raw), 10, "B blocked on its read")
                await raw.xadd(stream, {"id": call_id, "fn": "state::update",
                                        "body": increment(scope), "reply": second})
                (by_b,) = await pop_replies(raw, second, 1)  # B applies the call
                (taken_over,) = await pop_replies(raw, first, 1)  # B takes A's entry over
                # ... not before A had it for the visibility timeout (Redis's clock; 2 ms
                # for rounding to whole milliseconds)
                assert await redis_ms(raw) - delivered_ms >= visibility_ms - 2
                await proxy.release()  # A's requests reach Redis at last
                (by_a,) = await pop_replies(raw, first, 1)
                await until(lambda: drained(raw, stream, group), 10, "every entry acknowledged")
        tg.cancel_scope.cancel()
    assert by_b == taken_over == by_a
    assert msgspec.json.decode(by_b) == {"id": call_id, "ok": True, "result": {
        "old_value": None, "new_value": {"n": 1}, "version": 1}}
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        assert await store.get(scope, "counter") == {"n": 1}
        assert [(e.type, e.version) for e in await store.events(scope)] == [("state:created", 1)]
    assert await raw.llen(first) == 0 and await raw.llen(second) == 0


# ---- Redis lost in the middle of a batch -----------------------------------------------------
def in_transaction(scope: str) -> bytes:
    """`increment` as a transaction's one op: a call the service answers (its script does
    not: context.Answer)."""
    return msgspec.json.encode({"scope": scope, "ops": [
        {"op": "update", "key": "counter", "ops": INCREMENT}]})


async def test_redis_lost_mid_batch_leaves_calls_pending_then_answers_from_records(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """A batch's scripts run in Redis, then the connection is lost before their replies come
    back: the calls stay pending and unanswered; once the service is connected again it
    answers every one of them from its record, none applied twice."""
    stream, group, reply = f"{prefix}:bus:state", "state", f"{prefix}:reply:lost"
    batch = f"lost-{uuid.uuid4().hex[:8]}"
    ids = [f"{batch}-{i:02d}" for i in range(16)]
    marker = call_field(ids[0])  # the record's field of the first call, in its script's ARGV
    proxy = FaultProxy(redis_server.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(proxy.serve)
        proxy.arm("mute", marker)  # from the first script of these calls on
        async with StateService.running(settings_for(proxy.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=300, consumer="lost-1")):
            async with raw.pipeline(transaction=True) as pipe:  # one read gets all 16
                for call_id in ids:
                    pipe.xadd(stream, {"id": call_id, "fn": "state::transaction",
                                       "body": in_transaction(scope), "reply": reply})
                await pipe.execute()

            async def applied() -> bool:
                return await store.get(scope, "counter") == {"n": 16}

            await until(applied, 10, "the 16 scripts to run")
            # the scripts ran; no reply reached the service: nothing answered, all pending
            assert proxy.triggered.is_set()
            assert await raw.llen(reply) == 0
            assert (await raw.xpending(stream, group))["pending"] == 16
            proxy.cut()  # the connection is lost
            documents = await pop_replies(raw, reply, 16)
            await until(lambda: drained(raw, stream, group), 10, "every entry acknowledged")
        tg.cancel_scope.cancel()
        await assert_increments_once(documents, ids, store, scope)
    assert await raw.llen(reply) == 0  # one reply per call


async def test_redis_lost_mid_batch_of_calls_their_scripts_answered(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """The same loss for calls whose scripts answer them (state::update, context.Answer):
    the callers have their replies and the entries are acknowledged while the service still
    waits for the scripts' own replies; once connected again, nothing runs twice and no
    second reply is sent."""
    stream, group, reply = f"{prefix}:bus:state", "state", f"{prefix}:reply:lost"
    batch = f"fused-{uuid.uuid4().hex[:8]}"
    ids = [f"{batch}-{i:02d}" for i in range(16)]
    proxy = FaultProxy(redis_server.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(proxy.serve)
        proxy.arm("mute", call_field(ids[0]))
        async with StateService.running(settings_for(proxy.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=300, consumer="lost-2")):
            async with raw.pipeline(transaction=True) as pipe:
                for call_id in ids:
                    pipe.xadd(stream, {"id": call_id, "fn": "state::update",
                                       "body": increment(scope), "reply": reply})
                await pipe.execute()
            documents = await pop_replies(raw, reply, 16)  # sent by the scripts themselves
            assert proxy.triggered.is_set()
            assert await drained(raw, stream, group)
            proxy.cut()
            # served again after the loss: a marker call behind them, answered, so the
            # service has read whatever it would read again
            await raw.xadd(stream, {"id": f"after-{ids[0]}", "fn": "state::get",
                                    "body": msgspec.json.encode({"scope": scope, "key": "x"}),
                                    "reply": reply})
            (after,) = await pop_replies(raw, reply, 1)
            assert msgspec.json.decode(after)["id"] == f"after-{ids[0]}"
        tg.cancel_scope.cancel()
        answers = [msgspec.json.decode(d) for d in documents]
        assert sorted(a["id"] for a in answers) == ids
        assert sorted(a["result"]["new_value"]["n"] for a in answers) == list(range(1, 17))
        assert await store.get(scope, "counter") == {"n": 16}
        assert len(await store.events(scope)) == 16
    assert await raw.llen(reply) == 0  # one reply per call


# ---- the dedupe window -----------------------------------------------------------------------
async def test_call_records_are_kept_for_the_dedupe_window_and_then_dropped(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """A call id is applied at most once while its record is kept (`dedupe_window_ms`, here
    2 s), by the state service and by a user worker alike; after the window the id is new."""
    window_ms = 2000
    settings = settings_for(redis_server.url, prefix, dedupe_window_ms=window_ms)
    space = KeySpace(prefix, 4)
    worker = Worker("win", settings=settings, options=BusOptions(block_ms=50))
    worker_record = Bus(prefix, "win").record("win-2")
    runs = counted(worker, "win::run", lambda body, n: {"run": n})

    async def both() -> tuple[Any, Any]:
        state = await client.call("state::update", {"scope": scope, "key": "n",
                                                    "ops": INCREMENT}, call_id="win-1")
        user = await jobs.call("win::run", {}, call_id="win-2")
        return state, user

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            anyio.create_task_group() as tg, \
            StateClient(settings=settings) as client, \
            StateClient(settings=settings, service="win") as jobs:
        await tg.start(worker.run)
        first = await both()
        found = await record_of(raw, space, "win-1", window_ms)
        assert found is not None
        state_record = found[0]  # the slice holding it (this test's prefix: only its calls)
        assert 0 < await raw.pttl(state_record) <= window_ms + slice_ms(window_ms)
        assert 0 < await raw.pttl(worker_record) <= window_ms
        assert await both() == first  # within the window: the recorded replies, nothing run
        assert first == ({"old_value": None, "new_value": {"n": 1}, "version": 1}, {"run": 1})

        async def forgotten() -> bool:
            return await raw.exists(state_record, worker_record) == 0

        await until(forgotten, 10, "the records to expire")
        # after the window the same id is a new call: applied again
        assert await both() == ({"old_value": {"n": 1}, "new_value": {"n": 2}, "version": 2},
                                {"run": 2})
        assert runs == ["win-2", "win-2"]
        worker.stop()


# ---- one call id, one run ----------------------------------------------------------------------
async def test_a_slow_call_sent_again_by_the_client_runs_once(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str
) -> None:
    """The client sends a call again (same id: a new stream entry) at a third of its timeout;
    a handler slower than that still runs once, and its reply answers the call."""
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs: list[str] = []

    @worker.function("orders::charge")
    async def charge(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        await anyio.sleep(1.5)  # slower than the client's re-send at 1 s: what is tested
        return {"charged": body["amount"]}

    stream = Bus(prefix, "orders").stream
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="orders", timeout=3.0,
                               retries=2) as client:
            result = await client.call("orders::charge", {"amount": 10}, call_id="charge-1")

            async def served() -> bool:  # every entry (the re-send too) answered or dropped
                return await raw.xlen(stream) == 0

            await until(served, 10, "the re-sent entry to be served")
        worker.stop()
    assert result == {"charged": 10}
    assert runs == ["charge-1"]


async def test_a_call_sent_again_to_another_worker_while_it_runs_runs_once(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str
) -> None:
    """While one worker runs a call, the client's re-send of it (same id) is read by another
    worker: that one finds the id claimed and does not run it; the first run answers."""
    settings = settings_for(redis_server.url, prefix)
    first = Worker("orders", settings=settings, options=BusOptions(block_ms=50, consumer="a"))
    second = Worker("orders", settings=settings, options=BusOptions(block_ms=50, consumer="b"))
    runs: dict[str, list[str]] = {"a": [], "b": []}
    started = anyio.Event()

    for name, worker in (("a", first), ("b", second)):
        @worker.function("orders::charge")
        async def charge(body: Any, call: Call, name: str = name) -> Any:
            runs[name].append(call.id or "")
            started.set()
            await anyio.sleep(3.0)  # slower than the client's re-send at 2 s: what is tested
            return {"charged": body["amount"]}

    stream = Bus(prefix, "orders").stream
    async with anyio.create_task_group() as tg, \
            StateClient(settings=settings, service="orders", timeout=6.0, retries=2) as client:
        await tg.start(first.run)
        calling = tg.start_soon  # (the call waits while the workers change)
        outcome: list[Any] = []

        async def call() -> None:
            outcome.append(await client.call("orders::charge", {"amount": 10},
                                             call_id="charge-2"))

        calling(call)
        await started.wait()
        first.stop()  # reads no more; its run goes on and answers
        await tg.start(second.run)  # the re-sends are this one's

        async def answered() -> bool:
            return bool(outcome) and await raw.xlen(stream) == 0

        await until(answered, 15, "the call answered and every entry served")
        second.stop()
    assert outcome == [{"charged": 10}]
    assert runs == {"a": ["charge-2"], "b": []}


async def test_a_second_call_with_an_id_in_flight_in_the_client_is_refused(
    redis_server: RedisServer, prefix: str
) -> None:
    """Two calls with one id at once in one client: the second is refused at once (naming
    `call_id`), the first is answered as if alone."""
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    started, release = anyio.Event(), anyio.Event()
    runs: list[str] = []

    @worker.function("orders::hold")
    async def hold(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        started.set()
        await release.wait()
        return {"held": body["n"]}

    outcome: list[Any] = []
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="orders", timeout=10.0) as client:

            async def first() -> None:
                outcome.append(await client.call("orders::hold", {"n": 1}, call_id="hedge-1"))

            async with anyio.create_task_group() as calls:
                calls.start_soon(first)
                await started.wait()
                with pytest.raises(InvalidRequest) as refused:
                    await client.call("orders::hold", {"n": 1}, call_id="hedge-1")
                release.set()
        worker.stop()
    assert refused.value.code == "INVALID_REQUEST"
    assert refused.value.details["path"] == "call_id"
    assert "already in flight in this client" in refused.value.message
    assert outcome == [{"held": 1}]
    assert runs == ["hedge-1"]


async def test_a_call_answered_deadline_exceeded_runs_when_sent_again_with_a_later_deadline(
    redis_server: RedisServer, prefix: str
) -> None:
    """DEADLINE_EXCEEDED is not recorded (docs/bus-protocol.md): the id stays free, and the
    call sent again with a later deadline runs."""
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs = counted(worker, "orders::ship", lambda body, n: {"shipped": body["n"]})

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="orders", timeout=5.0) as client:
            with pytest.raises(StateError) as late:
                await client.call("orders::ship", {"n": 1}, call_id="ship-1",
                                  deadline_ms=now_ms() - 1000)
            again = await client.call("orders::ship", {"n": 1}, call_id="ship-1")
            recorded = await client.call("orders::ship", {"n": 1}, call_id="ship-1")
        worker.stop()
    assert late.value.code == "DEADLINE_EXCEEDED"
    assert again == recorded == {"shipped": 1}
    assert runs == ["ship-1"]  # not run when late; run once in time, then its record


async def test_a_malformed_reply_naming_a_waiting_call_answers_it_internal(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str
) -> None:
    """A reply document that names a waiting call's id but is not a reply document (here
    `ok` is not a boolean) answers that call with INTERNAL naming the document, rather than
    leaving it to wait for its timeout."""
    settings = settings_for(redis_server.url, prefix)
    stream = Bus(prefix, "nobody").stream  # (no worker: the only reply is the bad one)
    async with StateClient(settings=settings, service="nobody", timeout=10.0) as client:
        outcome: list[BaseException] = []

        async def call() -> None:
            try:
                await client.call("nobody::run", {}, call_id="bad-1")
            except StateError as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)

            async def sent() -> bool:
                return await raw.xlen(stream) >= 1

            await until(sent, 10, "the call to reach the stream")
            await raw.lpush(client.reply_key, b'{"id":"bad-1","ok":"yes"}')
    [error] = outcome
    assert isinstance(error, StateError) and error.code == "INTERNAL"
    assert '{"id":"bad-1","ok":"yes"}' in error.message
    assert error.details["call_id"] == "bad-1"


async def test_a_call_whose_run_died_runs_when_its_entry_is_served_again(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str
) -> None:
    """A worker died (kill -9) while running a call: its entry is pending in its history and
    its claim of the id, naming that entry, is still alive (the visibility timeout). The
    worker starts again under the same consumer name and reads its history first: that
    entry takes the claim over and runs, and the caller is answered (at least once), where a
    re-send of the id (another entry) would not run."""
    bus = Bus(prefix, "orders")
    body = b'{"amount":10}'
    reply = f"{bus.reply_prefix}died"
    await raw.xgroup_create(bus.stream, bus.group, id="0", mkstream=True)
    entry_id = await raw.xadd(bus.stream, {"id": "died-1", "fn": "orders::charge",
                                           "body": body, "reply": reply})
    await raw.xreadgroup(bus.group, "w1", {bus.stream: ">"}, count=1)  # (the dead run's read)
    digest = call_digest("orders::charge", body).encode()
    await raw.set(bus.record("died-1"), digest + b"\n@" + bus.stream.encode() + b" " + entry_id,
                  px=60_000)  # (the dead run's claim)
    worker = Worker("orders", settings=settings_for(redis_server.url, prefix),
                    options=BusOptions(block_ms=50, consumer="w1"))
    runs = counted(worker, "orders::charge", lambda body, n: {"charged": body["amount"]})

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        answer = await raw.blpop([reply], timeout=15)
        worker.stop()
    assert runs == ["died-1"]
    assert answer is not None and msgspec.json.decode(answer[1])["result"] == {"charged": 10}
