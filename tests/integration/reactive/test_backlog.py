"""The trigger backlog: a target service nobody serves never grows Redis without bound. Its
call stream holds at most STATEWORKER_TRIGGER_BACKLOG entries plus one event's calls; its
triggers are set aside (the trigger shows `waiting_on`, the metric stateworker_trigger_waiting;
the partition's other triggers go on: test_aside.py), the writes go on, and once a worker
drains the stream every call is delivered, each once, none lost."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from stateworker.reactive import batch
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

TRIGGERS, BACKLOG, WRITES = 20, 50, 10


async def figures(settings: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`stateworker status`'s dispatch and triggers."""
    report = await status_report(settings)
    return report["dispatch"], report["triggers"]


@contextlib.asynccontextmanager
async def serving(redis_server: RedisServer, prefix: str, scope: str
                  ) -> AsyncIterator[tuple[Settings, StateClient]]:
    """A service with the backlog BACKLOG and TRIGGERS triggers on `scope`, each calling the
    dead service `reactor`; its settings and a client."""
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client:
        for i in range(TRIGGERS):
            await client.call("state::register-trigger", {
                "id": f"t{i:02}", "function_id": "reactor::on_change", "service": "reactor",
                "config": {"scope": scope}})
        yield settings, client


async def test_a_dead_targets_stream_stays_within_the_backlog_and_nothing_is_lost(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    stream = bus_stream(prefix, "reactor")
    client_redis = redis_server.client()
    async with serving(redis_server, prefix, scope) as (settings, client):
        # Written with triggers paused, so that the events come to the dispatcher in one
        # batch: its calls gathered are counted before they are in Redis.
        await client.call("state::on-config-change", {"triggers_enabled": False})
        for n in range(WRITES):  # never slowed: each is answered
            await client.set(scope, f"k{n}", "x" * 1000)
        await client.call("state::on-config-change", {"triggers_enabled": None})

        async def waits_twice() -> bool:
            dispatch, triggers = await figures(settings)
            return dispatch["counters"].get("backlog_waits", 0) >= 2 and all(
                t["waiting_on"] is not None for t in triggers)

        await until(waits_twice, 30, "the dispatch to stop at the full stream, twice")
        # Events of 20 calls each go out while the stream has room: 50 -> 30 -> 10 -> -10.
        assert client_redis.xlen(stream) == 60
        _, triggers = await figures(settings)
        assert {t["waiting_on"]["stream"] for t in triggers} == {stream}
        assert all(t["lag_events"] == WRITES - 3 and t["delivered"] == 3 for t in triggers)

        # A worker drains it: every call goes out, each once.
        async with Handler(settings).running() as handler:
            await until(lambda: len(handler.calls) >= TRIGGERS * WRITES, 30, "every delivery")
            ids = [call_id for call_id, _ in handler.calls]
            assert len(set(ids)) == len(ids) == TRIGGERS * WRITES
            assert sorted({body["key"] for _, body in handler.calls}) == sorted(
                f"k{n}" for n in range(WRITES))

            async def cleared() -> bool:
                _, triggers = await figures(settings)
                return all(t["waiting_on"] is None and t["lag_events"] == 0 for t in triggers)

            await until(cleared, 30, "the triggers to show no wait and no lag")


async def test_the_backlog_holds_when_each_event_is_a_batch_of_its_own(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """The dispatcher keeps each target stream's room across batches (counted down by its
    hand-ons; the length read again when stale or half used): one event at a time, the
    stream still stops at the backlog plus one event's calls, and a stream found full is read
    again once its workers drain it."""
    stream = bus_stream(prefix, "reactor")
    client_redis = redis_server.client()
    async with serving(redis_server, prefix, scope) as (settings, client):
        for n in range(3):  # 50 -> 30 -> 10 -> -10: each event handed on alone
            await client.set(scope, f"k{n}", n)
            await until(lambda n=n: client_redis.xlen(stream) == TRIGGERS * (n + 1), 30,
                        f"event {n}'s calls")
        await client.set(scope, "k3", 3)

        async def waits() -> bool:
            dispatch, _ = await figures(settings)
            return dispatch["counters"].get("backlog_waits", 0) >= 1

        await until(waits, 30, "the dispatch to stop at the full stream")
        assert client_redis.xlen(stream) == 60
        async with Handler(settings).running() as handler:
            await until(lambda: len(handler.calls) >= TRIGGERS * 4, 30, "every delivery")
            assert len({call_id for call_id, _ in handler.calls}) == TRIGGERS * 4


@contextlib.asynccontextmanager
async def room_of_49(redis_server: RedisServer, prefix: str, scope: str
                     ) -> AsyncIterator[tuple[Settings, StateClient]]:
    """A service with the backlog BACKLOG and one trigger on `scope` calling the dead service
    `reactor`, whose first event's call is handed on: the stream's length read (0), its room
    counted down to 49."""
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client:
        await client.call("state::register-trigger", {
            "id": "t", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await client.set(scope, "first", 0)
        stream, raw = bus_stream(prefix, "reactor"), redis_server.client()
        await until(lambda: raw.xlen(stream) == 1, 30, "the first event's call")
        yield settings, client


async def test_calls_another_replica_added_are_seen_once_half_the_room_is_used(
        redis_server: RedisServer, prefix: str, scope: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A target stream's room is counted down by this dispatcher's hand-ons and read again
    (XLEN) when half of it is used, however fresh: calls another replica added meanwhile stop
    the dispatch there. (ROOM_S made long: a read is never stale by its age here.)"""
    monkeypatch.setattr(batch, "ROOM_S", 3600.0)
    stream = bus_stream(prefix, "reactor")
    client_redis = redis_server.client()
    async with room_of_49(redis_server, prefix, scope) as (settings, client):
        for n in range(45):  # another replica's calls, not counted by this dispatcher
            client_redis.xadd(stream, {"id": f"other-{n}", "fn": "reactor::on_change",
                                       "body": "{}", "reply": ""})
        for n in range(40):
            await client.set(scope, f"k{n}", n)

        async def waits() -> bool:
            dispatch, _ = await figures(settings)
            return dispatch["counters"].get("backlog_waits", 0) >= 1

        await until(waits, 30, "the dispatch to stop at the full stream")
        # 24 more handed on while the room counted was above half (49 -> 25), then the
        # length read again: 1 + 45 + 24 = 70, 20 over the backlog, and no more.
        assert client_redis.xlen(stream) == 70


async def test_a_length_read_mid_batch_counts_the_calls_the_batch_gathered_and_not_sent(
        redis_server: RedisServer, prefix: str, scope: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of 100 events for a stream with room for 49: its calls are gathered, not on
    the stream, when half the room is used and the length is read again (1); the room is the
    backlog less that length and the 24 gathered, so the batch stops at the backlog exactly.
    (ROOM_S made long: the length is read again for half the room only.)"""
    monkeypatch.setattr(batch, "ROOM_S", 3600.0)
    stream = bus_stream(prefix, "reactor")
    client_redis = redis_server.client()
    async with room_of_49(redis_server, prefix, scope) as (settings, client):
        await client.call("state::on-config-change", {"triggers_enabled": False})
        for n in range(100):  # (paused: the dispatcher reads them as one batch)
            await client.set(scope, f"k{n}", n)
        await client.call("state::on-config-change", {"triggers_enabled": None})

        async def waits() -> bool:
            dispatch, _ = await figures(settings)
            return dispatch["counters"].get("backlog_waits", 0) >= 1

        await until(waits, 30, "the dispatch to stop at the full stream")
        assert client_redis.xlen(stream) == BACKLOG
