"""A bus condition nobody answers leaves its call on the condition service's stream (a
timeout does not take it back): each trigger naming it added one event document there at
every event it matched, for good. The condition stream holds the trigger backlog at most, as a
handler's does: past it the condition is not asked (`RESOURCE_EXHAUSTED`, the event skipped for
that trigger, as at a timeout), and the other triggers of the partition are served meanwhile.
Its failures are logged once a window per kind, not a line per trigger per event."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aredis

from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import bus_stream
from stateworker.logs import repeats
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BACKLOG, DEAD_TRIGGERS, WRITES = 5, 3, 20


async def test_a_condition_nobody_answers_fills_its_stream_to_the_backlog_only(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG)
    raw = aredis.Redis(port=redis_server.port)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store, \
            Handler(settings).running() as theirs:
        assert service.dispatcher is not None
        for i in range(DEAD_TRIGGERS):  # one caller's: a condition service nobody serves
            await store.call("state::register-trigger", {
                "id": f"mine-{i}", "function_id": "sink::f", "service": "sink", "config": {
                    "scope": scope, "condition_function_id": "void::ask",
                    "condition_service": "void", "condition_timeout_ms": 1}})
        await store.call("state::register-trigger", {  # another's, on the same scope
            "id": "theirs", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await until(lambda: len(service.dispatcher.triggers.ids) == DEAD_TRIGGERS + 1, 10,
                    "the triggers loaded")
        for i in range(WRITES):
            await store.set(scope, f"k{i:02}", "x" * 1000)

        await until(lambda: len(theirs.calls) == WRITES, 30,
                    "the other trigger served every event")
        assert theirs.delivered_keys() == [f"k{i:02}" for i in range(WRITES)]
        # (its call for the last event went out after the conditions before it were asked)
        assert await raw.xlen(bus_stream(prefix, "void")) <= BACKLOG
        await service.dispatcher.counts.flush()
        errors = [t["last_error"] for t in (await status_report(settings))["triggers"]
                  if t["id"].startswith("mine-")]
        assert [e["code"] for e in errors] == ["RESOURCE_EXHAUSTED"] * DEAD_TRIGGERS
        assert "config.condition_service" in errors[0]["message"]
        assert f"the trigger backlog of {BACKLOG}" in errors[0]["message"]
    await raw.aclose()


async def test_failing_conditions_do_not_flood_the_log(
        redis_server: RedisServer, prefix: str, scope: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger's failed condition was a warning line per trigger per event: a caller's
    triggers on a dead condition service wrote one for every write anyone made to the scope.
    Said once a window per kind of failure (the window made long: the test's whole run), with
    every failure counted and each trigger's last in `status`; another trigger is served."""
    monkeypatch.setattr(repeats, "every_s", 3600.0)
    settings = settings_for(redis_server, prefix, trigger_backlog=BACKLOG)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store, \
            Handler(settings).running() as theirs:
        dispatcher = service.dispatcher
        assert dispatcher is not None
        for i in range(DEAD_TRIGGERS):
            await store.call("state::register-trigger", {
                "id": f"mine-{i}", "function_id": "sink::f", "service": "sink", "config": {
                    "scope": scope, "condition_function_id": "void::ask",
                    "condition_service": "void", "condition_timeout_ms": 1}})
        await store.call("state::register-trigger", {
            "id": "theirs", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await until(lambda: len(dispatcher.triggers.ids) == DEAD_TRIGGERS + 1, 10,
                    "the triggers loaded")
        caplog.set_level(logging.WARNING, "stateworker.reactive.dispatcher")
        for i in range(WRITES):
            await store.set(scope, f"k{i:02}", i)
        await until(lambda: len(theirs.calls) == WRITES, 30, "the other trigger served")
        await dispatcher.counts.flush()
        stats = await service.state.conn.execute("HGET", service.state.keys.dispatch_stats,
                                                 "condition_errors")
        assert int(stats) == DEAD_TRIGGERS * WRITES
    lines = [r for r in caplog.records if getattr(r, "event", "") == "dispatch.condition_failed"]
    assert {r.code for r in lines} == {"TIMEOUT", "RESOURCE_EXHAUSTED"}
    assert len(lines) == 2  # (one a kind: the rest held back, counted in the next line)
