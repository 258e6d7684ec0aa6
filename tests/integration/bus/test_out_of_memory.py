"""The bus while Redis is out of memory (maxmemory, policy noeviction): a flood of another
caller fills Redis while calls are in flight. Redis then refuses the SET and LPUSH of a reply
but would still run XACK and XDEL: a call that ran keeps its entry pending until its reply is
written, and is answered once memory is freed, applied once."""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis
from anyio.abc import TaskGroup

from stateworker import StateClient, StateError, StateStore, logs
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import call_field
from tests.calls import INCREMENT
from tests.integration.bus.replies import assert_increments_once, drained, pop_replies
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import FaultProxy, RedisServer

pytestmark = pytest.mark.anyio


async def refused_for_memory(raw: aredis.Redis) -> int:
    """How many commands Redis refused as out of memory (INFO errorstats)."""
    return int((await raw.info("errorstats")).get("errorstat_OOM", {}).get("count", 0))


async def test_calls_that_ran_when_redis_filled_up_are_answered_once_it_has_room(
        own_redis: RedisServer, prefix: str, scope: str) -> None:
    """16 transactions run; before their replies are written, Redis reaches its maxmemory.
    The replies cannot be written: the entries stay pending, unanswered. Memory freed, every
    call is answered from its record: 16 replies, the counter 16, none applied twice."""
    raw = aredis.Redis(port=own_redis.port)
    stream, group, reply = f"{prefix}:bus:state", "state", f"{prefix}:reply:full"
    batch = f"full-{uuid.uuid4().hex[:8]}"
    ids = [f"{batch}-{i:02d}" for i in range(16)]
    body = msgspec.json.encode({"scope": scope, "ops": [  # (the service writes its reply)
        {"op": "update", "key": "counter", "ops": INCREMENT}]})
    proxy = FaultProxy(own_redis.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            own_redis.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(proxy.serve)
        proxy.arm("late", call_field(ids[0]))  # the scripts' replies kept from the first on
        async with StateService.running(settings_for(proxy.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=60_000, consumer="full-1")):
            async with raw.pipeline(transaction=True) as pipe:  # one read gets all 16
                for call_id in ids:
                    pipe.xadd(stream, {"id": call_id, "fn": "state::transaction",
                                       "body": body, "reply": reply})
                await pipe.execute()

            async def applied() -> bool:
                return await store.get(scope, "counter") == {"n": 16}

            await until(applied, 10, "the 16 scripts to run")
            # A flood fills Redis: from now on it refuses whatever may grow memory.
            await raw.config_set("maxmemory-policy", "noeviction")
            await raw.config_set("maxmemory", 1)
            refused = await refused_for_memory(raw)
            await proxy.release()  # the service learns its scripts ran, and answers
            await until(lambda: _more(raw, refused), 10, "the replies refused")
            assert await raw.llen(reply) == 0
            assert (await raw.xpending(stream, group))["pending"] == 16  # none acknowledged
            await raw.config_set("maxmemory", 0)  # the flood's keys deleted: room again
            documents = await pop_replies(raw, reply, 16)
            await until(lambda: drained(raw, stream, group), 10, "every entry acknowledged")
        tg.cancel_scope.cancel()
        await assert_increments_once(documents, ids, store, scope)
    assert await raw.llen(reply) == 0  # one reply per call
    await raw.aclose()


async def _more(raw: aredis.Redis, than: int) -> bool:
    return await refused_for_memory(raw) > than


async def applied_then_full(tg: TaskGroup, client: StateClient, store: StateStore,
                            raw: aredis.Redis, scope: str, body: dict[str, Any]
                            ) -> dict[str, object]:
    """The transaction `body` called in the background (its outcome, "result" or "error",
    in the dict returned) and waited for until applied; then a flood fills Redis."""
    outcome: dict[str, object] = {}

    async def call() -> None:
        try:
            outcome["result"] = await client.call("state::transaction", body)
        except StateError as exc:
            outcome["error"] = exc

    tg.start_soon(call)

    async def applied() -> bool:
        return await store.get(scope, "counter") == {"n": 1}

    await until(applied, 10, "the first send applied")
    await raw.config_set("maxmemory-policy", "noeviction")
    await raw.config_set("maxmemory", 1)  # a flood fills Redis
    return outcome


async def test_a_resend_refused_for_memory_does_not_say_nothing_was_written(
        own_redis: RedisServer, prefix: str, scope: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A caller's transaction reaches the stream and is applied, its reply is slow to come
    (held on the way back to the service), and Redis fills up before the client re-sends
    it. The re-send is refused (OOM): the client must not say that nothing was written, since
    its first send was applied. Once a caller frees memory, the reply of that one run comes.
    Meanwhile the log says each kind of failure once every REPEAT_S, not once a try (it said
    460 lines in this test's few seconds: Redis refused, a reply not written, a reap)."""
    caplog.set_level(logging.WARNING, "stateworker")
    began = time.monotonic()
    raw = aredis.Redis(port=own_redis.port)
    body = {"scope": scope, "ops": [{"op": "update", "key": "counter", "ops": INCREMENT}]}
    settings = settings_for(own_redis, prefix)
    proxy = FaultProxy(own_redis.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            own_redis.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(proxy.serve)
        proxy.arm("late", scope.encode())  # the service's script reply is held
        async with StateService.running(settings_for(proxy.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=60_000)), \
                StateClient(settings=settings, timeout=30, retries=2) as client:
            outcome = await applied_then_full(tg, client, store, raw, scope, body)
            await proxy.release()  # (its reply is refused too: Redis is full)
            # The client's re-send (a third of its timeout after the first) is refused.
            await until(lambda: _xadds_refused(raw), 30, "the re-send refused")
            error = outcome.get("error")
            assert not (isinstance(error, StateError) and "nothing was written" in
                        error.message), error
            await raw.config_set("maxmemory", 0)  # room again
            await until(lambda: bool(outcome), 30, "the call's outcome")
        tg.cancel_scope.cancel()
        result = outcome.get("result")
        assert isinstance(result, dict) and result["results"][0]["new_value"] == {"n": 1}, \
            outcome
        assert await store.get(scope, "counter") == {"n": 1}
    lines = Counter(getattr(r, "event", r.getMessage()) for r in caplog.records)
    assert lines["redis.oom"] >= 1, lines  # (it was full)
    # (once a window per event and kind of failure: logs.Repeats)
    lines = Counter((getattr(r, "event", r.getMessage()), getattr(r, "kind", ""))
                    for r in caplog.records)
    assert max(lines.values()) <= 1 + int((time.monotonic() - began) // logs.REPEAT_S), lines
    await raw.aclose()


async def test_a_call_served_again_while_redis_is_full_is_not_answered_nothing_was_written(
        own_redis: RedisServer, prefix: str, scope: str) -> None:
    """A caller's transaction is applied, and Redis fills up before its reply is written: the
    entry stays pending and the service serves it again, but Redis now refuses to run its
    script (OOM: before the script could find the call's record). That refusal is no answer to
    the call: a RESOURCE_EXHAUSTED ("nothing was written") queued from it and written as
    memory is freed, between the refusal and its LPUSH, told the caller that its applied call
    never ran. That moment is made certain here: a proxy holds the service's writes from the
    first that carries RESOURCE_EXHAUSTED until memory is freed."""
    raw = aredis.Redis(port=own_redis.port)
    stream, group = f"{prefix}:bus:state", "state"
    body = {"scope": scope, "ops": [{"op": "update", "key": "counter", "ops": INCREMENT}]}
    # The service -> `scripts` -> `answers` -> Redis: `scripts` keeps its first script's reply
    # (the call applied, its reply not yet written), `answers` an answer RESOURCE_EXHAUSTED.
    answers = FaultProxy(own_redis.port)
    async with anyio.create_task_group() as tg, StateStore.open(
            own_redis.url, prefix=prefix, partitions=4, reaper=False) as store:
        await tg.start(answers.serve)
        scripts = FaultProxy(answers.port)
        await tg.start(scripts.serve)
        scripts.arm("late", scope.encode())
        answers.arm("hold", b"RESOURCE_EXHAUSTED")
        async with StateService.running(settings_for(scripts.url, prefix), BusOptions(
                block_ms=50, visibility_timeout_ms=60_000)), \
                StateClient(settings=settings_for(own_redis, prefix), timeout=30,
                            retries=2) as client:
            outcome = await applied_then_full(tg, client, store, raw, scope, body)
            await scripts.release()  # its reply refused: the entry is served again, refused

            async def refused_and_handled() -> bool:
                # An answer to the refused run is held, or the entry was read once more after
                # it (delivered a third time): either way the refusal was dealt with.
                if answers.triggered.is_set():
                    return True
                entries = await raw.xpending_range(stream, group, "-", "+", 10)
                return any(e["times_delivered"] >= 3 for e in entries)

            await until(refused_and_handled, 30, "a run of the pending entry refused")
            await raw.config_set("maxmemory", 0)  # room again
            if answers.triggered.is_set():
                await answers.release()
            await until(lambda: bool(outcome), 30, "the call's outcome")
        tg.cancel_scope.cancel()
        result = outcome.get("result")
        assert isinstance(result, dict) and result["results"][0]["new_value"] == {"n": 1}, \
            outcome
        assert await store.get(scope, "counter") == {"n": 1}
    await raw.aclose()


async def _xadds_refused(raw: aredis.Redis) -> bool:
    """Whether Redis refused an XADD (INFO commandstats: the client's, as no one else adds)."""
    stats = (await raw.info("commandstats")).get("cmdstat_xadd", {})
    return int(stats.get("rejected_calls", 0)) > 0
