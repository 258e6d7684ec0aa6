"""A bus re-send of a step write (state/core/once.py) that meets its call's live claim (the
run goes on elsewhere, or died and left its claim for CLAIM_MS) is not run and waits in the
stream for its reply to be kept; it holds up no other caller's call. It used to be taken for
Redis being away: the reader paused (50 ms doubling to 1 s) and read its whole history again,
every other call on that service waiting, for as long as the claim lived."""

from __future__ import annotations

import time

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.entries import call_digest
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.scripts.bindings import BIND, bind_call, kept_call
from stateworker.settings import Settings
from stateworker.state.core.once import CLAIM_MS
from tests.integration.busproto import receive, send, until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_resend_meeting_a_live_claim_holds_up_no_other_call(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    options = BusOptions(block_ms=50, visibility_timeout_ms=1000)  # (a reclaim within 1 s)
    async with StateService.running(settings, options) as service, \
            StateClient(settings=settings, timeout=30) as client:
        await _claimed(service, client, raw, prefix, scope)


async def _claimed(service: StateService, client: StateClient, raw: aredis.Redis, prefix: str,
                   scope: str) -> None:
    fn, body = "state::delete-by-topic", {"scope": scope, "topic_pattern": "t"}
    await client.set(scope, "a", 1, topic="t")
    state = service.state
    # What a run leaves when its replica dies between its claim and its reply: the claim.
    ctx = CallContext(call_id="dead-run", call_digest=call_digest(fn, msgspec.json.encode(body)))
    claim = bind_call(state.settings, state.keys, ctx, state.cluster, "w", now_ms() + CLAIM_MS)
    (claimed,) = await state.conn.pipeline([BIND.command(state.library, *claim)])
    assert list(claimed[1:]) == [1]
    stream = f"{prefix}:bus:state"
    _, reply = await send(raw, prefix, fn, body, call_id="dead-run")  # the client's re-send

    async def served() -> bool:
        return bool((await raw.xpending(stream, "state"))["pending"])

    await until(served, 10, "the re-send served (and left pending)")
    started = time.monotonic()
    for i in range(40):  # other calls, one after another, while the claim lives
        await client.set(f"{scope}-other", f"k{i}", i)
    elapsed = time.monotonic() - started
    # (each takes a few ms; held up by the reader's pauses until the claim went, 40-60 s)
    assert elapsed < 10, f"40 other calls took {elapsed:.1f} s"
    assert await raw.llen(reply) == 0  # not run, not answered: the claim's run answers
    assert await client.get(scope, "a") == 1  # nothing deleted
    # The run keeps its reply: a reclaim serves the re-send again, from it.
    (kept,) = await state.conn.pipeline([BIND.command(
        state.library, *kept_call(claim, b'={"deleted":7}'))])
    assert list(kept[1:]) == [1]
    answer = await receive(raw, reply)
    assert (answer["id"], answer["ok"], answer["result"]) == ("dead-run", True, {"deleted": 7})
    assert await client.get(scope, "a") == 1
