"""A user `Worker` claims a call's id right where it reads the call, before the task that runs
it starts (bus/serving.py `_begin`): the claim Redis took decides which entry of an id runs.
Tried from a caller's side, against real Redis: entries of one id read together (a re-send
next to the first send, a late copy next to a live one), the worker's connection lost with
its claims run in Redis and their replies lost, and a worker killed (SIGKILL) with claimed
calls in flight, taken over by another. Each call runs once and is answered."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import Worker
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.clock import now_ms
from tests.integration.bus.replies import drained
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import FaultProxy, RedisServer

pytestmark = pytest.mark.anyio

SERVICE = "jobs"


def entry(call_id: str, reply: str, *, late: bool = False) -> dict[str, Any]:
    fields: dict[str, Any] = {"id": call_id, "fn": "jobs::run", "body": b"{}", "reply": reply}
    if late:
        fields["deadline_ms"] = now_ms() - 60_000  # passed before it was sent
    return fields


async def add(raw: aredis.Redis, stream: str, entries: list[dict[str, Any]]) -> list[bytes]:
    """The entries appended in one transaction (one read takes them together)."""
    async with raw.pipeline(transaction=True) as pipe:
        for fields in entries:
            pipe.xadd(stream, fields)
        added: list[bytes] = await pipe.execute()
    return added


def counting(worker: Worker, runs: Counter[str]) -> None:
    @worker.function("jobs::run")
    async def run(body: Any, call: Call) -> Any:
        runs[call.id or ""] += 1
        return {"ran": call.id, "run": runs[call.id or ""]}


async def replies_by_id(raw: aredis.Redis, reply: str) -> dict[str, list[Any]]:
    by_id: dict[str, list[Any]] = {}
    for document in reversed(await raw.lrange(reply, 0, -1)):  # oldest first
        answer = msgspec.json.decode(document)
        by_id.setdefault(answer["id"], []).append(
            answer["result"] if answer["ok"] else answer["error"]["code"])
    return by_id


async def test_entries_of_one_id_read_together_run_it_once(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """One read holds, per id, the first send, the client's re-send and a late copy (its
    deadline passed), in several orders. Each id runs once: its first live entry claims it,
    the others find the claim and are acknowledged without a reply (the run answers); a late
    copy read before any claim is answered DEADLINE_EXCEEDED (it is only looked up)."""
    stream, reply = Bus(prefix, SERVICE).stream, f"{prefix}:reply:together"
    await raw.xgroup_create(stream, SERVICE, id="0", mkstream=True)
    orders = {"send-resend": ("live", "live"), "send-late-resend": ("live", "late", "live"),
              "late-send-resend": ("late", "live", "live")}
    entries = [entry(f"{name}-{i}", reply, late=kind == "late")
               for i in range(8) for name, kinds in orders.items() for kind in kinds]
    await add(raw, stream, entries)
    worker = Worker(SERVICE, settings=settings_for(redis_server, prefix), options=BusOptions(
        block_ms=50, read_count=len(entries), consumer="w1"))
    runs: Counter[str] = Counter()
    counting(worker, runs)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await until(lambda: drained(raw, stream, SERVICE), 15, "every entry acknowledged")
        worker.stop()
    ids = {f"{name}-{i}" for i in range(8) for name in orders}
    assert runs == dict.fromkeys(ids, 1)
    assert await replies_by_id(raw, reply) == {
        call_id: (["DEADLINE_EXCEEDED"] if call_id.startswith("late-") else [])
        + [{"ran": call_id, "run": 1}] for call_id in ids}


async def test_two_workers_reading_the_sends_of_one_id_run_it_once(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """Two workers of one group read the first sends and re-sends of many ids as they come
    (each pair added together, so one worker's read may take both, or each worker one): each
    id runs once, on one of them, and every reply of an id is that run's."""
    stream, reply = Bus(prefix, SERVICE).stream, f"{prefix}:reply:two"
    await raw.xgroup_create(stream, SERVICE, id="0", mkstream=True)
    runs: Counter[str] = Counter()
    workers = [Worker(SERVICE, settings=settings_for(redis_server, prefix), options=BusOptions(
        block_ms=50, read_count=4, consumer=f"w{n}")) for n in (1, 2)]
    for worker in workers:
        counting(worker, runs)
    ids = [f"pair-{i}" for i in range(300)]
    async with anyio.create_task_group() as tg:
        for worker in workers:
            await tg.start(worker.run)
        for call_id in ids:
            await add(raw, stream, [entry(call_id, reply), entry(call_id, reply)])
        await until(lambda: drained(raw, stream, SERVICE), 30, "every entry acknowledged")
        for worker in workers:
            worker.stop()
    assert runs == dict.fromkeys(ids, 1)
    answered = await replies_by_id(raw, reply)
    assert answered.keys() == set(ids)
    for call_id, results in answered.items():  # (a re-send read after the record: its reply)
        assert results in ([{"ran": call_id, "run": 1}], [{"ran": call_id, "run": 1}] * 2)


async def test_claims_run_in_redis_with_their_replies_lost_run_each_call_once(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """The worker reads a call and its re-send together and sends their claims; Redis runs
    them (the first send's claim is taken), but the connection goes silent before the replies
    come back, then is cut. The calls are left pending; read again on a new connection, the
    first send finds its own claim and runs, the re-send finds it and is not run: one run,
    one reply, nothing left pending."""
    stream, reply = Bus(prefix, SERVICE).stream, f"{prefix}:reply:muted"
    await raw.xgroup_create(stream, SERVICE, id="0", mkstream=True)
    call_id = "muted-1"
    record = f"{stream}:done:{{{call_id}}}"
    proxy = FaultProxy(redis_server.port)
    runs: Counter[str] = Counter()
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        proxy.arm("mute", record.encode())  # the claim's connection: its replies go nowhere
        worker = Worker(SERVICE, settings=settings_for(proxy.url, prefix), options=BusOptions(
            block_ms=50, consumer="w1"))
        counting(worker, runs)
        await tg.start(worker.run)
        first, _ = await add(raw, stream, [entry(call_id, reply), entry(call_id, reply)])
        with anyio.fail_after(10):
            await proxy.triggered.wait()

        async def claimed() -> bool:  # Redis ran the first send's claim (its reply is lost)
            held = await raw.get(record) or b""
            return held.endswith(b"\n@" + stream.encode() + b" " + first)

        await until(claimed, 10, "the claim run in Redis")
        assert runs == {} and await raw.llen(reply) == 0
        proxy.cut()
        await until(lambda: drained(raw, stream, SERVICE), 15, "every entry acknowledged")
        worker.stop()
        tg.cancel_scope.cancel()
    assert runs == {call_id: 1}
    assert await replies_by_id(raw, reply) == {call_id: [{"ran": call_id, "run": 1}]}
    assert (await raw.get(record) or b"").endswith(b'"result":{"ran":"muted-1","run":1}}')


WORKER_SCRIPT = """
    import sys

    import redis.asyncio as aredis

    from stateworker import Worker
    from stateworker.bus.protocol import BusOptions
    from stateworker.settings import Settings

    url, prefix, port, consumer, visibility = sys.argv[1:6]
    worker = Worker("jobs", settings=Settings(redis_url=url, prefix=prefix, partitions=4),
                    options=BusOptions(block_ms=50, read_count=64,
                                       visibility_timeout_ms=int(visibility),
                                       consumer=consumer))


    @worker.function("jobs::run")
    async def run(body, call):
        async with aredis.Redis(port=int(port)) as r:
            await r.rpush(prefix + ":started", call.id)
            await r.blpop([prefix + ":release:" + call.id], timeout=60)
            applied = await r.incr(prefix + ":applied:" + call.id)  # the call's effect
        return {"ran": call.id, "applied": applied}


    worker.serve()
"""


def start_worker(script: Path, redis_server: RedisServer, prefix: str, consumer: str,
                 visibility_ms: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), redis_server.url, prefix,
                             str(redis_server.port), consumer, str(visibility_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()  # SIGKILL
    process.communicate(timeout=30)


async def test_a_worker_killed_with_claimed_calls_in_flight_is_taken_over_once_each(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, tmp_path: Path) -> None:
    """A worker process reads calls and their re-sends and claims them; its handlers are all
    running (none has its effect yet) when it is killed with SIGKILL. What the kill leaves is
    counted: the first sends pending, each with its claim, the re-sends acknowledged without
    a reply. The clients send each call once more while no worker runs. Another worker takes
    the pending entries over after its visibility timeout: each call runs once (its effect
    applied once) and is answered once, the re-sends made while it was down not run."""
    script = tmp_path / "jobs_worker.py"
    script.write_text(textwrap.dedent(WORKER_SCRIPT))
    stream, reply = Bus(prefix, SERVICE).stream, f"{prefix}:reply:killed"
    await raw.xgroup_create(stream, SERVICE, id="0", mkstream=True)
    ids = [f"kill-{i}" for i in range(8)]
    firsts = {}
    for call_id in ids:  # each call and its re-send, added together
        first, _ = await add(raw, stream, [entry(call_id, reply), entry(call_id, reply)])
        firsts[first] = call_id
    first_worker = start_worker(script, redis_server, prefix, "killed", 600_000)
    try:
        async def all_running() -> bool:  # every slot runs a call, the re-sends answered
            return (await raw.llen(f"{prefix}:started") == len(ids)
                    and (await raw.xpending(stream, SERVICE))["pending"] == len(ids))

        await until(all_running, 30, "every call running and the re-sends acknowledged")
    finally:
        kill(first_worker)
    pending = await raw.xpending_range(stream, SERVICE, "-", "+", 100)
    assert {p["message_id"]: p["consumer"] for p in pending} == dict.fromkeys(firsts, b"killed")
    assert await raw.xlen(stream) == len(ids) and await raw.llen(reply) == 0
    for entry_id, call_id in firsts.items():  # each left claimed by the entry that ran it
        held = await raw.get(f"{stream}:done:{{{call_id}}}")
        assert held is not None and held.endswith(b"\n@" + stream.encode() + b" " + entry_id)
        assert await raw.get(f"{prefix}:applied:{call_id}") is None
    started = await raw.lrange(f"{prefix}:started", 0, -1)
    assert sorted(started) == sorted(i.encode() for i in ids)
    await raw.delete(f"{prefix}:started")
    await add(raw, stream, [entry(call_id, reply) for call_id in ids])  # re-sent meanwhile
    second_worker = start_worker(script, redis_server, prefix, "taker", 500)
    try:
        async def taken_over() -> bool:  # the first sends run again, the re-sends answered
            return (await raw.llen(f"{prefix}:started") == len(ids)
                    and await raw.xlen(stream) == len(ids))

        await until(taken_over, 30, "the first sends taken over, the re-sends acknowledged")
        pending = await raw.xpending_range(stream, SERVICE, "-", "+", 100)
        assert {p["message_id"]: p["consumer"] for p in pending} == dict.fromkeys(firsts, b"taker")
        assert await raw.llen(reply) == 0
        for call_id in ids:
            await raw.rpush(f"{prefix}:release:{call_id}", "go")
        await until(lambda: drained(raw, stream, SERVICE), 30, "every entry acknowledged")
    finally:
        kill(second_worker)
    assert sorted(await raw.lrange(f"{prefix}:started", 0, -1)) == sorted(
        i.encode() for i in ids)  # each call ran again once, on the second worker
    for call_id in ids:
        assert await raw.get(f"{prefix}:applied:{call_id}") == b"1"
    assert await replies_by_id(raw, reply) == {
        call_id: [{"ran": call_id, "applied": 1}] for call_id in ids}
