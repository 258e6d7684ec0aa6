"""Deadlines: a call that timed out is never applied later, whether the `call` command or a
StateClient sent it; its id and deadline again get its outcome."""

from __future__ import annotations

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import CallTimeout, ConfigError, DeadlineExceeded
from stateworker.settings import DEDUPE_WINDOW_MS
from tests.integration.services import run_cli, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def drained(raw: aredis.Redis, stream: str) -> None:
    """Wait until the service has read and acknowledged every entry of `stream` (entries
    are deleted once answered, and no call stays pending)."""
    with anyio.fail_after(15):
        while await raw.xlen(stream) or (await raw.xpending(stream, "state"))["pending"]:
            await anyio.sleep(0.01)  # polling the stream


async def test_cli_call_that_timed_out_is_never_applied(redis_server: RedisServer,
                                                        raw: aredis.Redis, prefix: str,
                                                        scope: str) -> None:
    body = msgspec.json.encode({"scope": scope, "key": "late", "value": 1}).decode()
    # A service that ran once (its group is there) and is down now: the call is sent.
    await raw.xgroup_create(f"{prefix}:bus:state", "state", id="0", mkstream=True)
    started = now_ms()
    done = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call", "--timeout",
                                          "0.5", "state::set", body)
    assert done.returncode == 1, done.stderr
    error = msgspec.json.decode(done.stderr)
    assert error["code"] == "TIMEOUT"
    deadline = error["details"]["deadline_ms"]
    assert started + 500 <= deadline <= now_ms()  # its whole time, and over when it said so
    assert f"deadline_ms {deadline}" in error["message"]
    assert "or never" in error["message"] and "\n" not in error["message"]  # one short line
    assert "same call_id with the same deadline_ms returns its outcome" in error["details"][
        "outcome"]
    stream = f"{prefix}:bus:state"
    assert await raw.xlen(stream) >= 1  # the call is there, waiting for a service

    async with StateService.running(settings_for(redis_server, prefix),
                                    BusOptions(block_ms=50)):
        await drained(raw, stream)
        async with StateClient(settings=settings_for(redis_server, prefix)) as client:
            assert await client.get(scope, "late") is None  # read, and refused: too late


async def test_client_call_that_timed_out_is_never_applied(redis_server: RedisServer,
                                                           raw: aredis.Redis, prefix: str,
                                                           scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings, timeout=0.3) as client:
        with pytest.raises(CallTimeout) as caught:
            await client.set(scope, "late", 1)  # no service: sent, never answered
        details = caught.value.details
        assert details["deadline_ms"] <= now_ms()
        assert "applied by" in caught.value.message and "or never" in caught.value.message
        async with StateService.running(settings, BusOptions(block_ms=50)):
            await drained(raw, f"{prefix}:bus:state")
            assert await client.get(scope, "late") is None
            # Its id and deadline again: the outcome (it never ran), nothing applied now.
            with pytest.raises(DeadlineExceeded):
                await client.call("state::set", {"scope": scope, "key": "late", "value": 1},
                                  call_id=details["call_id"], deadline_ms=details["deadline_ms"])
            assert await client.get(scope, "late") is None


async def test_a_reply_lost_is_not_resent_past_the_calls_record(redis_server: RedisServer,
                                                                 raw: aredis.Redis, prefix: str,
                                                                 scope: str) -> None:
    """A call's record is kept one dedupe window (here 1 s); a client whose timeout is longer
    re-sends only within half of it, so a re-send never finds the record gone and applies the
    call again. The reply is lost for good: the client's reply list is a string (the script's
    LPUSH fails, the change stays; the client's pops fail)."""
    settings = settings_for(redis_server, prefix, dedupe_window_ms=1000)
    body = {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "", "by": 1}]}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=3.6, retries=2) as client:
        await client.set(scope, "n", 0)
        await raw.set(client.reply_key, "not a list")
        with pytest.raises(CallTimeout):  # re-sends were due at 1.2 s and 2.4 s
            await client.call("state::update", body)
        await drained(raw, f"{prefix}:bus:state")
        await raw.delete(client.reply_key)
        assert await client.get(scope, "n") == 1  # applied once


async def test_the_resend_horizon_is_the_services_window_not_the_clients(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """The record is kept the SERVICE's window (here 1 s); a client set to a longer one (60 s)
    reads the service's at connect and re-sends within half of it, so its re-sends, due at
    1.2 s and 2.4 s, never go out and the call is applied once. The reply is lost for good,
    as above."""
    body = {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "", "by": 1}]}
    async with StateService.running(settings_for(redis_server, prefix, dedupe_window_ms=1000),
                                    BusOptions(block_ms=50)), \
            StateClient(settings=settings_for(redis_server, prefix, dedupe_window_ms=60_000),
                        timeout=3.6, retries=2) as client:
        assert (client.service_window_ms, client.resend_window_ms) == (1000, 1000)
        await client.set(scope, "n", 0)
        await raw.set(client.reply_key, "not a list")
        with pytest.raises(CallTimeout):
            await client.call("state::update", body)
        await drained(raw, f"{prefix}:bus:state")
        await raw.delete(client.reply_key)
        assert await client.get(scope, "n") == 1  # applied once


async def test_a_client_that_cannot_read_the_window_keeps_to_the_default(
        redis_server: RedisServer, prefix: str) -> None:
    """No service has told its window (none started under this prefix): the client keeps the
    smaller of its own and the default window, and reads the service's once it can."""
    settings = settings_for(redis_server, prefix, dedupe_window_ms=DEDUPE_WINDOW_MS * 4)
    async with StateClient(settings=settings, timeout=3.0) as client:
        assert (client.service_window_ms, client.resend_window_ms) == (None, DEDUPE_WINDOW_MS)
    async with StateService.running(settings_for(redis_server, prefix, dedupe_window_ms=5000),
                                    BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=3.0) as client:
        assert (client.service_window_ms, client.resend_window_ms) == (5000, 5000)


async def test_in_acl_mode_a_service_keeps_at_least_the_default_window(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    """A principal may not read the service's window, so its client re-sends within half the
    default (7.5 min); a service keeping records a shorter time would apply such a re-send
    twice. It refuses to start, naming the setting and the limit, before it touches Redis.
    (The same settings are valid for a principal's client: its re-sends only come sooner.)"""
    settings = settings_for(redis_server, prefix, auth="acl", dedupe_window_ms=60_000)
    with pytest.raises(ConfigError) as refused:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            pass
    assert str(refused.value) == (
        f"dedupe_window_ms (STATEWORKER_DEDUPE_WINDOW_MS) must be at least {DEDUPE_WINDOW_MS} "
        f"with auth acl (a principal cannot read the service's window and re-sends within "
        f"half of {DEDUPE_WINDOW_MS} ms), got 60000")
    assert await raw.keys(f"{prefix}:*") == []
