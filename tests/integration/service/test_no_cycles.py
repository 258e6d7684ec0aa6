"""Serving a call leaves no reference cycles behind.

Python frees an object the moment its last reference goes, except when objects refer to each
other in a cycle: those wait for the cyclic collector, which pauses the whole service while
it walks them. A cycle made per call (a closure that calls itself) piled up about 17 objects
per write; under 64 writers the service paused 110-180 ms about once a second, and the
slowest calls took 190 ms instead of 30. So every function, native and engine, is served
here over the bus with the collector off, and what it left must be nothing."""

from __future__ import annotations

import gc
from typing import Any

import anyio
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.bus.protocol import Call as BusCall
from stateworker.bus.worker import Worker
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.calls import DAGU, Call, moco_calls
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

VALUE = {"n": 1, "tags": ["a", "b"]}


def calls(r: int) -> list[Call]:
    """Round `r`'s calls (function, body, context): every write path, the retry of set.lua (an
    update leaves the stored hash unknown: the diff after it computes the hash, then
    writes again; a Dagu get after one computes it before it answers), the barrier (a
    new named one asks for its keys: a second run), the paged lists and deletes, and the
    reads, native and through each engine."""
    return [
        ("state::set", {"scope": "s", "key": "k", "value": VALUE}, None),
        ("state::get", {"scope": "s", "key": "k"}, None),
        ("state::get-entry", {"scope": "s", "key": "k"}, None),
        ("state::compare-and-set", {"scope": "s", "key": "c", "expected": None, "value": r},
         None),
        ("state::update", {"scope": "s", "key": "u", "ops": [
            {"type": "increment", "path": "/n", "by": 1}]}, None),
        ("state::diff", {"scope": "s", "key": "u", "value": {"n": -r}}, None),
        ("state::list-entries", {"scope": "s"}, None),
        ("state::set", {"scope": "s", "key": f"t{r}", "value": r, "topic": "old"}, None),
        ("state::delete-by-topic", {"scope": "s", "topic_pattern": "old*"}, None),
        ("state::delete", {"scope": "s", "key": "gone"}, None),
        ("state::set", {"isolation": "workflow", "key": "k", "value": 1, "max_keys": 10},
         {"org_id": "o", "workflow_id": "w", "execution_id": "e"}),
        ("state::barrier", {"event": {"key": "a"},
                            "condition_config": {"id": f"named-{r}", "expect": ["a", "b"]}},
         None),
        ("state::barrier", {"event": {"key": "a"},  # completed: it expires (PEXPIREAT)
                            "condition_config": {"id": f"done-{r}", "expect": 1}}, None),
        ("state::delete-barrier", {"id": f"named-{r}"}, None),
        *moco_calls(VALUE),
        ("state.set", {"key": "k", "value": VALUE}, DAGU),
        ("state.get", {"key": "k"}, DAGU),
        ("state::update", {"scope": "dagu/dag/etl", "key": "u", "ops": [
            {"type": "increment", "path": "/n", "by": 1}]}, None),
        ("state.get", {"key": "u"}, DAGU),  # (the stored hash unknown: computed first)
        ("state.diff", {"key": "d", "value": VALUE}, DAGU),
        ("state.diff", {"key": "d", "value": r, "update": False}, DAGU),
        ("state.list", {}, DAGU),
        ("state.delete", {"key": "gone"}, DAGU),
    ]


async def test_no_call_leaves_a_reference_cycle(client: StateClient) -> None:
    for fn, body, context in calls(0):  # each path once, so every cache is filled first
        await client.call_json(fn, msgspec.json.encode(body), context=context)
    gc.collect()
    gc.disable()
    # What lives now is frozen: the collect after each call walks only what was made since,
    # not the whole test process (that cost ~0.1 s a call). A cycle through an object from
    # before the freeze is left to the full collect that ends each round.
    gc.freeze()
    try:
        left: dict[str, int] = {}
        for r in range(1, 6):
            for fn, body, context in calls(r):
                await client.call_json(fn, msgspec.json.encode(body), context=context)
                left[fn] = left.get(fn, 0) + gc.collect()
            gc.unfreeze()
            left[f"round {r}, through older objects"] = gc.collect()
            gc.freeze()
    finally:
        gc.unfreeze()
        gc.enable()
    assert {fn: n for fn, n in left.items() if n} == {}

async def test_a_user_workers_call_leaves_no_reference_cycle(redis_server: RedisServer,
                                                              prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix)
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))

    @worker.function("orders::create")
    async def create(body: Any, call: BusCall) -> Any:
        return {"order": body["id"], "by": call.ctx.caller}

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, service="orders", caller="shop") as client:
            await client.call("orders::create", {"id": 0})
            gc.collect()
            gc.disable()
            try:
                for n in range(20):
                    assert await client.call("orders::create", {"id": n}) == \
                        {"order": n, "by": "shop"}
                left = gc.collect()
            finally:
                gc.enable()
        worker.stop()
    assert left == 0


async def test_dispatching_an_event_to_a_trigger_leaves_no_reference_cycle(
        client: StateClient) -> None:
    """The dispatcher runs in the service: events read, matched, a condition evaluated (the
    barrier, in Redis), the handler's call appended, the position moved."""
    async with Handler(client.settings).running() as handler:
        gated = {"condition_function_id": "state::barrier",
                 "condition_config": {"id": "b", "expect": 99}}
        for trigger_id, config in (("plain", {"scope": "t"}),
                                   ("gated", {"scope": "t", **gated})):
            await client.call("state::register-trigger", {
                "id": trigger_id, "function_id": "reactor::on_change", "service": "reactor",
                "config": config})
        await client.call("state::set", {"scope": "t", "key": "g0", "value": 0})
        await until(lambda: len(handler.calls) >= 1, 10, "the first handler call")
        gc.collect()
        gc.disable()
        try:
            for n in range(1, 21):
                await client.call("state::set", {"scope": "t", "key": f"g{n}", "value": n})
            await until(lambda: len(handler.calls) >= 21, 10, "21 handler calls")
            left = gc.collect()
        finally:
            gc.enable()
    assert left == 0
    arrived = await client.call("state::barrier", {
        "event": {"key": "last"}, "condition_config": {"id": "b", "expect": 99}})
    assert arrived["reason"] == "barrier `b`: 22/99 arrived, waiting on 77 more"


async def test_snapshotting_writes_to_postgresql_leaves_no_reference_cycle(
        redis_server: RedisServer, prefix: str, postgres_url: str) -> None:
    """The snapshot runs in the service too: events read, batched, written to PostgreSQL,
    the position moved."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url)
    keys = KeySpace(prefix, 4)
    redis_client = redis_server.client()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client:
        await client.call("state::set", {"scope": "p", "key": "k0", "value": 0})
        await until(lambda: caught_up(redis_client, keys), 20, "the first snapshot round")
        gc.collect()
        gc.disable()
        try:
            for n in range(1, 21):
                await client.call("state::set", {"scope": "p", "key": f"k{n}", "value": n})
            await until(lambda: caught_up(redis_client, keys), 20, "the snapshot to catch up")
            left = gc.collect()
        finally:
            gc.enable()
    assert left == 0
