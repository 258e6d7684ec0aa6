"""A pending bus condition holds up only what follows it in its partition: the handler calls
of the events committed before it go out at once, and order is kept."""

from __future__ import annotations

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Gate, Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_events_before_a_pending_condition_are_delivered_while_it_waits(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """The writes are made before the dispatcher starts, so it reads them in one batch: an
    update, a set and a delete, then the conditioned write, then one more. The first three
    arrive while the condition is still unanswered (its timeout is a minute); the rest once
    it answers, in stream order."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    checker = Gate(settings, answer=True)
    release, asked, answered = checker.release, checker.asked, checker.answered

    base = {"function_id": "reactor::on_change", "service": "reactor"}
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store:
        await store.call("state::register-trigger", {**base, "id": "plain", "config": {
            "scope": scope, "key_prefix": "p-"}})
        await store.call("state::register-trigger", {**base, "id": "gated", "config": {
            "scope": scope, "key": "gate", "condition_function_id": "checker::gate",
            "condition_service": "checker", "condition_timeout_ms": 60000}})
        await store.set(scope, "p-1", {"n": 1})
        await store.call("state::update", {"scope": scope, "key": "p-1", "ops": [
            {"type": "increment", "path": "n", "by": 1}]})
        await store.set(scope, "p-2", "x")
        await store.delete(scope, "p-1")
        await store.set(scope, "gate", "open?")
        await store.set(scope, "p-3", "after the gate")
    async with StateService.running(settings, BusOptions(block_ms=50)), checker.running(), \
            Handler(settings).running() as handler:
        with anyio.fail_after(10):
            await asked.wait()
        await until(lambda: len(handler.calls) >= 4, 10,
                    "the calls of the events before the condition")
        assert not answered  # (still pending: its timeout is 60 s)
        assert [(body["event_type"], body["key"]) for _, body in handler.calls] == [
            ("state:created", "p-1"), ("state:updated", "p-1"), ("state:created", "p-2"),
            ("state:deleted", "p-1")]
        release.set()
        await until(lambda: len(handler.calls) >= 6, 10, "the calls after the condition")
        assert [body["key"] for _, body in handler.calls[4:]] == ["gate", "p-3"]
        assert answered == ["gate"]
