"""A reply Redis could not take (over its proto-max-bulk-len) is answered CALL_TOO_LARGE and
acknowledged: its LPUSH would drop the service's connection and leave the call pending, read
and run again in a loop. Its own Redis: proto-max-bulk-len is server-wide (lowered to its
1 MiB minimum so the test is small; the bus's max_reply_bytes below it, as 256 MiB is below
the 512 MB default)."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.integration.busproto import roundtrip, until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
LIMIT = 1_000_000


async def test_a_reply_over_the_limit_is_refused_and_acknowledged(own_redis: RedisServer,
                                                                  prefix: str) -> None:
    raw = aredis.Redis(port=own_redis.port)
    await raw.config_set("proto-max-bulk-len", 1024 * 1024)
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        max_value_bytes=400_000)
    try:
        async with StateService.running(settings, BusOptions(block_ms=50,
                                                             max_reply_bytes=LIMIT)):
            for key in "abc":
                done = await roundtrip(raw, prefix, "state::set",
                                       {"scope": "s", "key": key, "value": "x" * 399_000})
                assert done["ok"], done
            connections = (await raw.info("stats"))["total_connections_received"]
            # three distinct keys, within max_call_bytes (8 MiB): a reply of ~1.2 MB
            for fn, body in (("state::get-many", {"scope": "s", "keys": ["a", "b", "c"]}),
                             ("state::list", {"scope": "s"})):
                refused = await roundtrip(raw, prefix, fn, body)
                assert not refused["ok"], fn
                error = refused["error"]
                assert error["code"] == "CALL_TOO_LARGE", error
                assert error["details"]["path"] == "$" and error["details"]["limit"] == LIMIT
                assert error["details"]["size"] > LIMIT
                assert "max_reply_bytes" in error["message"]

            async def acknowledged() -> bool:
                summary = await raw.xpending(f"{prefix}:bus:state", "state")
                return bool(summary["pending"] == 0)

            await until(acknowledged, 10, "the refused calls acknowledged")
            # the service's connection was never dropped, and it answers the next call
            assert (await raw.info("stats"))["total_connections_received"] == connections
            small = await roundtrip(raw, prefix, "state::get-many",
                                    {"scope": "s", "keys": ["a", "b"]})
            assert small["ok"] and len(small["result"]["entries"]) == 2
    finally:
        await raw.aclose()
