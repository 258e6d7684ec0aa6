"""StateClient over the bus, a user's Worker with the same guarantees (a reused call id
refused, `Worker.serve()` answering the calls it read on SIGTERM), and the CLI."""

from __future__ import annotations

import decimal
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis
from anyio.abc import TaskStatus

from stateworker import Conflict, StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.clock import now_ms
from stateworker.errors import CallTimeout, InvalidRequest, Unavailable, UnknownFunction
from stateworker.settings import Settings
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def client_settings(redis_server: RedisServer, prefix: str) -> Settings:
    return Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)


async def test_client_typed_helpers(service: StateService, redis_server: RedisServer,
                                    prefix: str, scope: str) -> None:
    async with StateClient(settings=client_settings(redis_server, prefix),
                           caller="tester") as client:
        result = await client.set(scope, "k", {"price": decimal.Decimal("1.20")}, topic="t")
        assert result["created"] is True
        assert await client.get(scope, "k") == {"price": decimal.Decimal("1.20")}
        await client.update(scope, "n", [{"type": "increment", "path": "c", "by": 2}])
        assert (await client.compare_and_set(scope, "n", 5, expected={"c": 2}))["swapped"]
        assert await client.list_keys(scope) == ["k", "n"]
        assert scope in await client.list_groups()
        entry = await client.get_entry(scope, "k")
        assert entry["updated_by"] == "tester" and entry["topic"] == "t"
        assert (await client.list_entries(scope, topic_pattern="t"))["entries"][0]["key"] == "k"
        assert (await client.diff(scope, "n", 5))["changed"] is False
        assert await client.update_topic(scope, "k", None) == {"updated": True}
        assert await client.delete_by_topic(scope, "*") == {"deleted": 0}
        assert await client.delete(scope, "n") == 5
        with pytest.raises(Conflict) as caught:
            await client.set(scope, "k", 1, create_only=True)
        assert caught.value.details == {"expected_version": 0, "current_version": 1}
        with pytest.raises(InvalidRequest):
            await client.call("state::set", {"scope": scope})
        with pytest.raises(UnknownFunction):
            await client.call("state::nope", {})
        exact = await client.call_json("state::get", msgspec.json.encode(
            {"scope": scope, "key": "k"}))
        assert exact == b'{"price":{"$type":"decimal","$value":"1.20"}}'


async def test_what_json_cannot_hold_is_refused_not_changed(
        client: StateClient, store: StateStore, scope: str) -> None:
    """NaN and the infinities have no JSON form: refused before sending (the JSON encoder
    would have written null: a value changed without a word), as a value nested deeper than
    Python's stack is, naming the values' limit; in process the same."""
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    for value in (float("nan"), float("inf"), [1, {"x": float("-inf")}]):
        for caller in (client, store):
            with pytest.raises(InvalidRequest, match="has no JSON form"):
                await caller.call("state::set", {"scope": scope, "key": "f", "value": value})
            with pytest.raises(InvalidRequest, match="has no JSON form"):
                await caller.set(scope, "f", value)
    with pytest.raises(InvalidRequest) as deeper:
        await client.call("state::set", {"scope": scope, "key": "f", "value": deep})
    assert deeper.value.details == {"path": "$.value", "limit": 512}
    assert await client.get(scope, "f") is None  # nothing was written


async def test_a_timeout_no_deadline_holds_is_refused(client: StateClient, scope: str) -> None:
    for timeout in (1e308, float("nan"), -1.0):
        with pytest.raises(InvalidRequest) as refused:
            await client.call("state::get", {"scope": scope, "key": "k"}, timeout=timeout)
        assert refused.value.details == {"path": "timeout", "limit": 366 * 86_400}


async def test_a_closed_client_refuses_calls(service: StateService, redis_server: RedisServer,
                                             prefix: str, scope: str) -> None:
    async with StateClient(settings=client_settings(redis_server, prefix)) as client:
        await client.set(scope, "k", 1)
    with pytest.raises(Unavailable), anyio.fail_after(5):
        await client.get(scope, "k")


async def test_concurrent_calls_share_one_reply_reader(service: StateService,
                                                       redis_server: RedisServer, prefix: str,
                                                       scope: str) -> None:
    async with StateClient(settings=client_settings(redis_server, prefix)) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(client.update, scope, "c",
                              [{"type": "increment", "path": "n", "by": 1}])
        assert await client.get(scope, "c") == {"n": 200}


async def test_timeout_retries_with_the_same_id(redis_server: RedisServer, prefix: str,
                                                scope: str) -> None:
    settings = client_settings(redis_server, prefix)
    async with StateClient(settings=settings, timeout=0.2, retries=2) as client:
        with pytest.raises(CallTimeout):  # no service yet: three attempts, one id
            # A deadline well past the timeout, so the call may still run once a service
            # starts (by default a call's deadline ends with its timeout: bus/test_deadlines.py).
            await client.call("state::update", {"scope": scope, "key": "c", "ops": [
                {"type": "increment", "path": "n", "by": 1}]}, call_id="same-id",
                deadline_ms=now_ms() + 60_000)
        entries = await client.conn.execute("XRANGE", client.stream, "-", "+")
        assert [e[1][1] for e in entries] == [b"same-id"] * 3
        async with StateService.running(settings, BusOptions(block_ms=50)):
            with anyio.fail_after(10):  # served and acknowledged (deleted) first: a get in
                while await client.conn.execute("XLEN", client.stream):  # the same batch
                    await anyio.sleep(0.01)  # may finish before the writes' second step
            # the three deliveries of one id apply once
            assert await client.get(scope, "c") == {"n": 1}


async def test_user_worker_runs_each_call_id_once(redis_server: RedisServer, prefix: str) -> None:
    settings = client_settings(redis_server, prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs: list[Any] = []

    @worker.function("orders::create")
    async def create(body: Any, call: Call) -> Any:
        runs.append(body)
        return {"order": body["id"], "by": call.ctx.caller, "total": decimal.Decimal("9.90")}

    @worker.function()
    async def fail(body: Any, call: Call) -> Any:
        raise RuntimeError("boom")

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="orders", caller="shop") as client:
            first = await client.call("orders::create", {"id": 7}, call_id="order-7")
            again = await client.call("orders::create", {"id": 7}, call_id="order-7")
            assert first == again == {"order": 7, "by": "shop", "total": decimal.Decimal("9.90")}
            assert runs == [{"id": 7}]
            with pytest.raises(UnknownFunction):
                await client.call("orders::nope", {})
            with pytest.raises(InvalidRequest):
                await client.call_json("orders::create", b"not json")
            with pytest.raises(Exception) as caught:
                await client.call("orders::fail", {})
            assert getattr(caught.value, "code", None) == "INTERNAL"
            assert await client.call("orders::create", {"id": 8}) == {
                "order": 8, "by": "shop", "total": decimal.Decimal("9.90")}
        worker.stop()


def run_cli(redis_server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stateworker", "--redis-url", redis_server.url, *args],
        env={"STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4", "PATH": "/usr/bin"},
        capture_output=True, text=True, timeout=60, check=False)


async def test_cli_call_and_status(service: StateService, redis_server: RedisServer,
                                   prefix: str, scope: str) -> None:
    body = '{"scope": "' + scope + '", "key": "k", "value": [1.50]}'
    done = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call", "state::set", body)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["new_value"] == [1.5]
    assert '"new_value":[1.50]' in done.stdout
    bad = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call", "state::set", "{}")
    assert bad.returncode == 1 and msgspec.json.decode(bad.stderr)["code"] == "INVALID_REQUEST"
    with anyio.fail_after(10):
        while True:
            status = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "status")
            report = msgspec.json.decode(status.stdout)
            counters = report["services"]["state"]["counters"]
            if counters.get("calls", 0) >= 2:
                break
            await anyio.sleep(0.1)  # polling: counters reach Redis once a second
    assert report["reachable"] is True and report["aof"] is True
    state = report["services"]["state"]
    assert state["pending"] == 0 and state["consumers"][0]["name"]
    assert counters["errors:INVALID_REQUEST"] >= 1


async def test_restart_under_the_same_name_serves_its_pending_calls_once(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = client_settings(redis_server, prefix)
    stream, reply = f"{prefix}:bus:jobs", f"{prefix}:reply:jobs"
    raw = aredis.Redis(port=redis_server.port)
    await raw.xgroup_create(stream, "jobs", id="0", mkstream=True)
    for i in range(3):
        await raw.xadd(stream, {"id": f"job-{i}", "fn": "jobs::run", "body": b"{}",
                                "reply": reply})
    # a worker named w1 read them and died before answering: they are pending for w1
    await raw.xreadgroup("jobs", "w1", {stream: ">"})
    runs: list[str] = []
    worker = Worker("jobs", settings=settings, options=BusOptions(block_ms=50, consumer="w1"))

    @worker.function("jobs::run")
    async def run(body: Any, call: Call) -> Any:
        runs.append(call.id or "")
        return {"done": call.id}

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(10):
            while await raw.llen(reply) < 3:
                await anyio.sleep(0.01)  # polling the reply list
        worker.stop()
    assert sorted(runs) == ["job-0", "job-1", "job-2"]  # each pending call ran once
    assert await raw.llen(reply) == 3
    assert (await raw.xpending(stream, "jobs"))["pending"] == 0
    await raw.aclose()


async def test_stop_takes_effect_while_every_slot_is_busy(redis_server: RedisServer,
                                                          prefix: str) -> None:
    settings = client_settings(redis_server, prefix)
    worker = Worker("slow", settings=settings,
                    options=BusOptions(block_ms=50, concurrency=1, grace_s=0.2, consumer="w-slow"))
    started, cancelled, finished = anyio.Event(), anyio.Event(), anyio.Event()

    @worker.function("slow::wait")
    async def wait(body: Any, call: Call) -> Any:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise

    async def serve(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await worker.run(task_status=task_status)
        finished.set()

    stream, reply = f"{prefix}:bus:slow", f"{prefix}:reply:slow"
    raw = aredis.Redis(port=redis_server.port)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve)
            entry = await raw.xadd(stream, {"id": "never-done", "fn": "slow::wait", "body": b"{}",
                                            "reply": reply})
            with anyio.fail_after(10):
                await started.wait()
            worker.stop()
            with anyio.fail_after(10):  # stop is noticed, the grace period ends, run returns
                await finished.wait()
        assert cancelled.is_set()  # cut off at the end of the grace period
        # unfinished: not answered, not acknowledged: pending for another worker to take over
        pending = await raw.xpending_range(stream, "slow", "-", "+", 10)
        assert [(p["message_id"], p["consumer"]) for p in pending] == [(entry, b"w-slow")]
        assert await raw.llen(reply) == 0
        assert await raw.get(Bus(prefix, "slow").record("never-done")) is None
    finally:
        await raw.aclose()


async def test_stop_answers_calls_that_finish_within_the_grace_period(
    redis_server: RedisServer, prefix: str
) -> None:
    settings = client_settings(redis_server, prefix)
    worker = Worker("grace", settings=settings,
                    options=BusOptions(block_ms=50, concurrency=1, grace_s=30))
    started, release, finished = anyio.Event(), anyio.Event(), anyio.Event()

    @worker.function("grace::work")
    async def work(body: Any, call: Call) -> Any:
        started.set()
        await release.wait()
        async with aredis.Redis(port=redis_server.port) as own:
            for _ in range(20):  # the rest of its work: Redis round trips, all after the stop
                await own.ping()
        return {"done": call.id}

    async def serve(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        await worker.run(task_status=task_status)
        finished.set()

    stream, reply = f"{prefix}:bus:grace", f"{prefix}:reply:grace"
    raw = aredis.Redis(port=redis_server.port)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve)
            await raw.xadd(stream, {"id": "g-1", "fn": "grace::work", "body": b"{}",
                                    "reply": reply})
            with anyio.fail_after(10):
                await started.wait()
            worker.stop()  # with the call in flight: it has the grace period to finish
            release.set()
            with anyio.fail_after(10):
                await finished.wait()
        # answered (run() returns after the replies are written) and acknowledged
        answered = await raw.lrange(reply, 0, -1)
        assert [msgspec.json.decode(d) for d in answered] == [
            {"id": "g-1", "ok": True, "result": {"done": "g-1"}}]
        assert (await raw.xpending(stream, "grace"))["pending"] == 0
    finally:
        await raw.aclose()


# ---- user workers: a reused call id, serve() on SIGTERM --------------------------------------
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
