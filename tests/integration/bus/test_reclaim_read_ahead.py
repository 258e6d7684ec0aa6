"""An entry a runtime has read ahead (it waits in its lanes, pending to it) is not taken over
by that runtime's own reclaim once it is older than the visibility timeout: it would be served
twice, once from the reclaim and once from its lane (the second answered from the call's
record: two replies to one entry). Found under load by test_faults' kill -9 test (1,444
replies to 1,300 entries): the state service takes at most 64 calls at a time from its
lanes while its reclaim may take up to its concurrency, so a backlog older than the timeout
was served again."""

from __future__ import annotations

import collections

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

CALLS = 20_000


async def test_a_backlog_older_than_the_visibility_timeout_is_answered_once_an_entry(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    stream, reply = f"{prefix}:bus:state", f"{prefix}:reply:backlog"
    ids = [f"c{n}" for n in range(CALLS)]
    async with StateService.running(settings, BusOptions(
            block_ms=50, visibility_timeout_ms=200)) as service:
        runtime = service.runtime
        async with raw.pipeline(transaction=False) as pipe:
            for n, call_id in enumerate(ids):  # (one burst: most wait in the lanes)
                pipe.xadd(stream, {"id": call_id, "fn": "state::set", "reply": reply,
                                   "body": msgspec.json.encode(
                                       {"scope": scope, "key": f"k{n % 100}", "value": n})})
            await pipe.execute()

        async def all_answered() -> bool:
            if await raw.llen(reply) < CALLS:
                return False
            groups = await raw.xinfo_groups(stream)
            return bool(groups[0]["pending"] == 0 and groups[0]["lag"] == 0
                        and not runtime.lanes.held and not runtime.lanes.parked
                        and runtime._in_flight == 0)

        await until(all_answered, 120, "every call answered, nothing pending or read ahead")
        documents = await raw.lrange(reply, 0, -1)
    answered = collections.Counter(msgspec.json.decode(d)["id"] for d in documents)
    assert set(answered) == set(ids)
    assert [i for i, count in answered.items() if count > 1] == []
    assert len(documents) == CALLS
