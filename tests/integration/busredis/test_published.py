"""Replies published on the state's Redis (decision 0059): with the bus on a Redis of its own,
a call's script answers a successful call by PUBLISH on the state's Redis, where the client
listens (one hop sooner than the reply list on the bus); errors and replays come on the bus
as before. Pub/sub keeps nothing: a reply no one heard is answered on the bus, a subscription
that broke with a reply in flight makes the waiting calls ask again (applied once), and a
kill -9 of the state's Redis loses no write whose reply was published."""

from __future__ import annotations

import logging

import anyio
import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, call_entry
from stateworker.errors import Conflict
from stateworker.keys import bus_stream, reply_prefix
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair, assert_kept, flood_until
from tests.servers import ServiceProcess

pytestmark = pytest.mark.anyio

WRITERS = 16
ACKED_BEFORE_KILL = 400


async def test_successes_come_published_errors_and_replays_on_the_bus(
        pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=5) as client:
        assert client.published_replies == 0
        first = await client.call("state::set", {"scope": scope, "key": "k", "value": 1},
                                  call_id="set-1")
        assert await client.get(scope, "k") == 1
        assert (await client.call("state::set", {  # (a compare-and-set on the version)
            "scope": scope, "key": "k", "value": 2, "expected_version": 1}))["version"] == 2
        await client.call("state::delete", {"scope": scope, "key": "gone"})
        assert client.published_replies == 4
        # An error is the service's to answer, on the bus.
        with pytest.raises(Conflict):
            await client.call("state::set", {"scope": scope, "key": "k", "value": 3,
                                             "expected_version": 1})
        # (a function whose script does not answer: compare-and-set by value)
        assert (await client.call("state::compare-and-set", {
            "scope": scope, "key": "k", "value": 2, "expected": 2}))["swapped"] is True
        # A replay too: the recorded reply, the same as the first time.
        assert await client.call("state::set", {"scope": scope, "key": "k", "value": 1},
                                 call_id="set-1") == first
        assert client.published_replies == 4
        assert await client.get(scope, "k") == 2
        assert client.published_replies == 5


async def test_a_reply_no_one_hears_is_answered_on_the_bus(pair: Pair, prefix: str,
                                                            scope: str) -> None:
    """A caller that asks for its reply published but does not listen (its subscription gone,
    a program that sets the field) still gets it, on its reply list."""
    settings = pair.settings(prefix)
    reply_list = f"{reply_prefix(prefix)}deaf"
    async with StateService.running(settings, BusOptions(block_ms=50)):
        bus = pair.bus.client()
        body = msgspec.json.encode({"scope": scope, "key": "k", "value": {"n": 1}})
        bus.execute_command(*call_entry(bus_stream(prefix, "state"), "deaf-1", "state::set",
                                        body, reply_list, publish=True))
        # (in a thread: the service serves in this event loop)
        popped = await anyio.to_thread.run_sync(lambda: bus.blpop([reply_list], timeout=4))
        assert popped is not None, "no reply on the bus"
        reply = msgspec.json.decode(popped[1])
        assert reply["id"] == "deaf-1" and reply["ok"] is True
        assert reply["result"]["version"] == 1 and reply["result"]["created"] is True


async def test_a_reply_lost_with_the_subscription_is_asked_again(pair: Pair, prefix: str,
                                                                 scope: str) -> None:
    """The subscription breaks after Redis sent it a reply and before the client read it: the
    call is sent again at once (no re-send left: `retries=0`) and answered from its record,
    applied once."""
    settings = pair.settings(prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=5, retries=0) as client, \
            StateStore.open(pair.state.url, prefix=prefix, partitions=4, reaper=False,
                            durability="strict") as store:
        published = client._published
        assert published is not None and published.live and published._proto is not None
        transport = published._proto.transport
        assert transport is not None
        transport.pause_reading()  # (the published reply waits in the socket, unread)
        result: dict[str, object] = {}

        async def write() -> None:
            result.update(await client.call("state::set",
                                            {"scope": scope, "key": "k", "value": 1}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            await until(lambda: store.get(scope, "k"), 10, "the write applied")
            transport.abort()  # the connection lost with the reply in it
        assert result["version"] == 1 and result["created"] is True
        assert (await store.get_entry(scope, "k")).version == 1


async def test_kill_9_of_the_state_redis_loses_no_write_whose_reply_was_published(
        pair: Pair, prefix: str, scope: str) -> None:
    service = ServiceProcess(pair.state.url, prefix, env={
        "STATEWORKER_BUS_REDIS_URL": pair.bus.url, "STATEWORKER_DURABILITY": "strict"})
    service.start()
    try:
        async with StateClient(settings=pair.settings(prefix), timeout=2) as client:
            acked = await flood_until(client, scope, WRITERS, ACKED_BEFORE_KILL,
                                      pair.state.kill)
            assert client.published_replies >= ACKED_BEFORE_KILL
    finally:
        service.kill()
    pair.state.start()  # on its AOF
    await assert_kept(pair.state, prefix, scope, acked)


async def test_a_large_reply_and_a_resend_come_on_the_bus(pair: Pair, prefix: str,
                                                          scope: str) -> None:
    """A result over 64 KiB is not published (a burst of them would pass Redis's pub/sub
    buffer limit and close the subscription); a re-send is never published, so a read whose
    published reply never reaches the client (a path gone silent) is still answered."""
    settings = pair.settings(prefix)
    big = "x" * 70_000
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=5, retries=2) as client:
        await client.set(scope, "big", big)
        assert await client.get(scope, "big") == big
        assert client.published_replies == 0
        await client.set(scope, "k", 1)
        assert client.published_replies == 1
        published = client._published
        assert published is not None and published._proto is not None
        transport = published._proto.transport
        assert transport is not None
        transport.pause_reading()  # (published replies are sent, never read)
        assert await client.get(scope, "k") == 1
        assert client.published_replies == 1


async def test_a_subscription_that_cannot_be_made_is_logged_once_an_outage(
        pair: Pair, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    """The state's Redis away: the client's subscription fails again and again (each call
    would be answered on the bus meanwhile); one warning names the Redis, not one a try, and
    one line says when the subscription is back."""
    settings = pair.settings(prefix)
    with caplog.at_level("INFO", logger="stateworker.transport.subscriber"):
        async with StateClient(settings=settings, timeout=5) as client:
            published = client._published
            assert published is not None and published.live
            pair.state.kill()
            await until(lambda: published.failures >= 3, 30, "three failed subscriptions")
            pair.state.start()
            await until(lambda: published.live, 30, "the subscription back")
            assert published.failures == 0

    def lines(event: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", "") == event]

    failed = lines("client.subscribe_failed")
    assert len(failed) == 1 and pair.state.url in failed[0].getMessage()
    back = lines("client.subscribed")
    assert len(back) == 1 and "failed tries" in back[0].getMessage()


async def test_a_subscription_refused_for_good_is_logged_and_calls_go_on(
        pair: Pair, prefix: str, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """A client whose user on the state's Redis may not SUBSCRIBE: one warning names the Redis
    and the refusal, and its calls are answered on the bus."""
    with pair.state.client() as admin:
        admin.execute_command("ACL", "SETUSER", "nosub", "on", ">pw", "~*", "&*", "+@all",
                              "-subscribe")
    settings = pair.settings(prefix)
    client_settings = pair.settings(
        prefix, redis_url=f"redis://nosub:pw@127.0.0.1:{pair.state.port}/0")
    with caplog.at_level("INFO", logger="stateworker.transport.subscriber"):
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=client_settings, timeout=5) as client:
            await client.set(scope, "k", 1)
            assert await client.get(scope, "k") == 1
            assert client.published_replies == 0
    refused = [r for r in caplog.records if getattr(r, "event", "") == "client.subscribe_refused"]
    assert len(refused) == 1
    message = refused[0].getMessage()
    assert f"redis://nosub:***@127.0.0.1:{pair.state.port}/0" in message and "NOPERM" in message
    assert "pw@" not in message
