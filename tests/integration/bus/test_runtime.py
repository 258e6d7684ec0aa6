"""Promises of the README and docs/architecture.md that no other test holds the service to:
exactly once when a call is delivered twice at once, the visibility timeout, Redis lost in
the middle of a batch, the library reloaded under calls in flight, expired entries in listings
and in the way of writes, the dedupe window, `Worker.serve()` on SIGTERM, call-id reuse on
user workers.

Faults come from real processes and sockets: `FaultProxy` (tests/servers.py) holds or mutes
one connection of an in-process service; tests that change the whole server get their own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateError, StateStore, Worker
from stateworker.app.service import StateService
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.clock import now_ms
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import FaultProxy, RedisServer

pytestmark = pytest.mark.anyio

INCREMENT = [{"type": "increment", "path": "n", "by": 1}]


def increment(scope: str, key: str = "counter") -> bytes:
    return msgspec.json.encode({"scope": scope, "key": key, "ops": INCREMENT})


async def drained(raw: aredis.Redis, stream: str, group: str) -> bool:
    """Every entry of the stream acknowledged and deleted."""
    return (await raw.xpending(stream, group))["pending"] == 0 and await raw.xlen(stream) == 0


async def pop_replies(raw: aredis.Redis, reply: str, count: int, timeout: float = 30
                      ) -> list[bytes]:
    """`count` reply documents from `reply`, oldest first; fails after `timeout`."""
    documents: list[bytes] = []
    with anyio.fail_after(timeout):
        while len(documents) < count:
            popped = await raw.brpop([reply], timeout=1)
            if popped is not None:
                documents.append(popped[1])
    return documents


async def redis_ms(raw: aredis.Redis) -> int:
    seconds, micros = await raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


def settings_for(url: str, prefix: str, **extra: Any) -> Settings:
    return Settings(redis_url=url, prefix=prefix, partitions=4, **extra)


# ---- two consumers, one call ---------------------------------------------------------------------
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
async def test_redis_lost_mid_batch_leaves_calls_pending_then_answers_from_records(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """A batch's scripts run in Redis, then the connection is lost before their replies come
    back: the calls stay pending and unanswered; once the service is connected again it
    answers every one of them from its record, none applied twice."""
    stream, group, reply = f"{prefix}:bus:state", "state", f"{prefix}:reply:lost"
    batch = f"lost-{uuid.uuid4().hex[:8]}"
    ids = [f"{batch}-{i:02d}" for i in range(16)]
    record_prefix = KeySpace(prefix, 4).for_scope(scope).call_record(batch)
    proxy = FaultProxy(redis_server.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(proxy.serve)
        proxy.arm("mute", record_prefix.encode())  # from the first script of these calls on
        async with StateService.running(settings_for(proxy.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=300, consumer="lost-1")):
            async with raw.pipeline(transaction=True) as pipe:  # one read gets all 16
                for call_id in ids:
                    pipe.xadd(stream, {"id": call_id, "fn": "state::update",
                                       "body": increment(scope), "reply": reply})
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
        answers = [msgspec.json.decode(d) for d in documents]
        assert sorted(a["id"] for a in answers) == ids and all(a["ok"] for a in answers)
        # answered from the records of the first run: the counter's values 1..16, one each
        assert sorted(a["result"]["new_value"]["n"] for a in answers) == list(range(1, 17))
        assert await store.get(scope, "counter") == {"n": 16}
        assert len(await store.events(scope)) == 16
    assert await raw.llen(reply) == 0  # one reply per call


# ---- the library reloaded under calls already sent ----------------------------------------
async def test_function_flush_while_calls_flow_on_the_bus(own_redis: RedisServer,
                                                         prefix: str, scope: str) -> None:
    """FUNCTION FLUSH (on a server of its own) while 8 clients keep calling: calls whose
    scripts were already on the wire meet "Function not found", the library is loaded again
    and they are repeated; every call succeeds, each write applied once."""
    settings = settings_for(own_redis.url, prefix)
    flushes, writes = 3, [0]
    rounds = [0] * 8  # calls made by each caller
    admin = aredis.Redis(port=own_redis.port)
    stop = anyio.Event()

    async def caller(client: StateClient, n: int) -> None:
        while not stop.is_set():
            await client.update(scope, "counter", INCREMENT)
            writes[0] += 1
            page = await client.list_entries(scope, key_pattern="counter")
            assert [e["key"] for e in page["entries"]] == ["counter"]
            rounds[n] += 1

    async def loaded() -> bool:
        return len(await admin.function_list()) == 1

    try:
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings) as client:
            await client.update(scope, "counter", INCREMENT)
            writes[0] += 1
            async with anyio.create_task_group() as tg:
                for n in range(8):
                    tg.start_soon(caller, client, n)
                for _ in range(flushes):
                    await admin.function_flush()
                    # only a call meeting the missing library loads it again
                    await until(loaded, 10, "the library to be loaded again")
                    # the calls that met it, repeated, are done before the next flush: each
                    # caller finished a round it began after the load
                    since = list(rounds)

                    async def next_rounds(since: list[int] = since) -> bool:
                        return all(now >= then + 2 for now, then in zip(rounds, since,
                                                                         strict=True))

                    await until(next_rounds, 10, "every caller to go on")
                stop.set()
            assert await client.get(scope, "counter") == {"n": writes[0]}
        errors = await admin.info("errorstats")
        assert errors["errorstat_ERR"]["count"] >= flushes  # "ERR Function not found" replies
    finally:
        await admin.aclose()


# ---- expired entries --------------------------------------------------------------------------
async def pass_time(until_ms: int) -> None:
    """Wait for the clock to pass `until_ms` (the condition under test is the clock itself)."""
    while now_ms() <= until_ms:
        await anyio.sleep((until_ms - now_ms() + 1) / 1000)


async def test_list_entries_skips_expired_entries(redis_server: RedisServer, prefix: str,
                                                  scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        expired_by = 0
        for key, topic, ttl in [("a", None, 30), ("b", None, None), ("c", "t", 30),
                                ("d", "t", 3_600_000), ("e", None, None), ("f", "t", 30)]:
            await store.set(scope, key, key, topic=topic, ttl_ms=ttl)
            expired_by = now_ms() + 30
        await pass_time(expired_by)  # a, c and f have expired; the reaper is off

        async def keys(**body: Any) -> list[str]:
            got, after = [], None
            while True:
                page = await store.call("state::list-entries", {
                    "scope": scope, "include_values": True, **body,
                    **({"after": after} if after else {})})
                got += [e["key"] for e in page["entries"]]
                assert all(e["value"] == e["key"] for e in page["entries"])
                if (after := page.get("next_after")) is None:
                    return got

        for order_by in ("key", "updated_at", "topic"):
            for order in ("asc", "desc"):
                for limit in (1, 2, 1000):
                    got = await keys(order_by=order_by, order=order, limit=limit)
                    assert sorted(got) == ["b", "d", "e"], (order_by, order, limit, got)
        first = await store.call("state::list-entries", {"scope": scope, "limit": 2})
        assert [e["key"] for e in first["entries"]] == ["b", "d"]  # expired ones take no room
        assert await keys(topic_pattern="t") == ["d"]
        assert await keys(key_pattern="*", prefix="") == ["b", "d", "e"]
        assert await keys(offset=1) == ["d", "e"]


async def test_a_write_meeting_an_expired_entry_deletes_it_first(
    redis_server: RedisServer, prefix: str, scope: str
) -> None:
    """set, update, delete and update-topic (beyond compare-and-set) on an entry whose expiry
    passed before the reaper came: the entry is deleted with its state:deleted event (no
    writer, as the reaper's) before the write goes on as on a missing key."""
    writes: dict[str, tuple[dict[str, Any], Any, list[tuple[str, str, str, int, str]]]] = {
        # function: (request, reply, events after the deletion)
        "state::set": ({"value": "new"}, {"old_value": None, "new_value": "new", "version": 1,
                                         "created": True},
                       [("state:created", "null", '"new"', 1, "w")]),
        "state::update": ({"ops": INCREMENT}, {"old_value": None, "new_value": {"n": 1},
                                               "version": 1},
                          [("state:created", "null", '{"n":1}', 1, "w")]),
        "state::delete": ({}, None, []),
        "state::update-topic": ({"topic": "x"}, {"updated": False}, []),
    }
    async with StateStore.open(redis_server.url, prefix=prefix, reaper=False) as store:
        expired_by = 0
        for fn in writes:
            await store.set(scope, fn, f"old {fn}", topic="t", ttl_ms=30)
            expired_by = now_ms() + 30
        await pass_time(expired_by)
        part = store.state.keys.for_scope(scope)
        for fn, (body, expected, after) in writes.items():
            mark = (await store.events(scope))[-1].revision
            result = await store.call(fn, {"scope": scope, "key": fn, **body}, caller="w")
            if fn == "state::set":
                result = {k: v for k, v in result.items() if k != "hash"}
            assert result == expected, fn
            events = [(e.type, bytes(e.old_value).decode(), bytes(e.new_value).decode(),
                       e.version, e.by) for e in await store.events(scope, mark)]
            assert events == [
                ("state:deleted", msgspec.json.encode(f"old {fn}").decode(), "null", 1, ""),
                *after], fn
        assert await store.list_keys(scope) == ["state::set", "state::update"]
        assert await store.state.conn.execute("ZCARD", part.ttl) == 0  # no expiry left behind
        page = await store.call("state::list-entries", {"scope": scope, "topic_pattern": "t"})
        assert page["entries"] == []  # set replaces the topic; update of a new entry has none
        assert await store.reap_expired() == 0  # nothing left for the reaper


# ---- the dedupe window -------------------------------------------------------------------------
async def test_call_records_are_kept_for_the_dedupe_window_and_then_dropped(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    """A call id is applied at most once while its record is kept (`dedupe_window_ms`, here
    2 s), by the state service and by a user worker alike; after the window the id is new."""
    window_ms = 2000
    settings = settings_for(redis_server.url, prefix, dedupe_window_ms=window_ms)
    state_record = KeySpace(prefix, 4).for_scope(scope).call_record("win-1")
    worker = Worker("win", settings=settings, options=BusOptions(block_ms=50))
    worker_record = Bus(prefix, "win").record("win-2")
    runs: list[str] = []

    @worker.function("win::run")
    async def run(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        return {"run": len(runs)}

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
        for record in (state_record, worker_record):
            assert 0 < await raw.pttl(record) <= window_ms
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


# ---- user workers ----------------------------------------------------------------------------------
async def test_a_user_worker_refuses_a_reused_call_id(redis_server: RedisServer,
                                                      prefix: str) -> None:
    """The same id with another body or another function is CALL_ID_REUSED, and the function
    is not run for it; the same call again gets the recorded reply."""
    settings = settings_for(redis_server.url, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs: list[Any] = []

    @worker.function("orders::create")
    async def create(body: Any, call: Call) -> Any:
        runs.append(("create", body))
        return {"created": body["n"]}

    @worker.function("orders::cancel")
    async def cancel(body: Any, call: Call) -> Any:
        runs.append(("cancel", body))
        return {"cancelled": body["n"]}

    async with anyio.create_task_group() as tg, \
            StateClient(settings=settings, service="orders") as client:
        await tg.start(worker.run)
        assert await client.call("orders::create", {"n": 1}, call_id="same") == {"created": 1}
        for fn, body in [("orders::create", {"n": 2}), ("orders::cancel", {"n": 1})]:
            with pytest.raises(StateError) as refused:
                await client.call(fn, body, call_id="same")
            assert refused.value.code == "CALL_ID_REUSED", (fn, body, refused.value)
            assert "same" in refused.value.message
        assert await client.call("orders::create", {"n": 1}, call_id="same") == {"created": 1}
        assert runs == [("create", {"n": 1})]
        worker.stop()


WORKER_SCRIPT = """
    import sys

    import redis.asyncio as aredis

    from stateworker import Worker
    from stateworker.bus.protocol import BusOptions
    from stateworker.settings import Settings

    url, prefix, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    worker = Worker("jobs", settings=Settings(redis_url=url, prefix=prefix, partitions=4),
                    options=BusOptions(block_ms=50, concurrency=3, grace_s=30,
                                       consumer="serve-1"))


    @worker.function("jobs::slow")
    async def slow(body, call):
        async with aredis.Redis(port=port) as r:
            await r.rpush(prefix + ":started", call.id)
            released = await r.blpop([prefix + ":release:" + call.id], timeout=30)
            for _ in range(20):  # more work after the release
                await r.ping()
        return {"id": call.id, "released": released is not None}


    @worker.function("jobs::fast")
    async def fast(body, call):
        return {"id": call.id}


    worker.serve()
    print("served", flush=True)
"""


async def test_worker_serve_answers_the_calls_it_read_on_sigterm_and_exits_0(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, tmp_path: Path
) -> None:
    script = tmp_path / "jobs_worker.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT))
    stream, reply = f"{prefix}:bus:jobs", f"{prefix}:reply:jobs"
    slow_ids, fast_ids = [f"slow-{i}" for i in range(3)], [f"fast-{i}" for i in range(2)]
    async with raw.pipeline(transaction=False) as pipe:
        for call_id in slow_ids + fast_ids:
            pipe.xadd(stream, {"id": call_id, "fn": f"jobs::{call_id.split('-')[0]}",
                               "body": b"{}", "reply": reply})
        await pipe.execute()
    process = subprocess.Popen([sys.executable, str(script), redis_server.url, prefix,
                                str(redis_server.port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        started = []
        with anyio.fail_after(30):
            while len(started) < 3:  # the three slow calls run, every slot taken
                popped = await raw.blpop([f"{prefix}:started"], timeout=1)
                if popped is not None:
                    started.append(popped[1].decode())
        assert sorted(started) == slow_ids
        process.send_signal(signal.SIGTERM)  # with three calls in flight
        for call_id in slow_ids:
            await raw.lpush(f"{prefix}:release:{call_id}", "go")
        out, err = await anyio.to_thread.run_sync(lambda: process.communicate(timeout=60))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert out.strip() == "served" and "Traceback" not in err, err
    # every call it read answered and acknowledged; the rest left in the stream, unread
    assert (await raw.xpending(stream, "jobs"))["pending"] == 0
    answers = {d["id"]: d for d in (msgspec.json.decode(x) for x in await raw.lrange(reply, 0, -1))}
    unread = {fields[b"id"].decode() for _, fields in await raw.xrange(stream)}
    assert await raw.llen(reply) == len(answers)  # one reply per call
    for call_id in slow_ids:
        assert answers[call_id] == {"id": call_id, "ok": True,
                                    "result": {"id": call_id, "released": True}}
    assert answers.keys() | unread == set(slow_ids + fast_ids)
    assert not answers.keys() & unread
