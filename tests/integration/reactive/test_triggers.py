"""Triggers: registration, filters, delivery in revision order with the documented body,
unregistering on every replica, and at-least-once across a dispatcher's crash."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.errors import BarrierConfig, InvalidRequest, KeyTooLong, ReservedScope
from stateworker.events.reader import scope_events
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.handlers import Gate, Handler
from tests.integration.snapshots import all_dispatched
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def settings_for(redis_server: RedisServer, prefix: str, **more: Any) -> Settings:
    return Settings(redis_url=redis_server.url, prefix=prefix, partitions=4, **more)


async def test_a_scope_and_key_trigger_gets_exactly_its_events_in_order(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings, caller="writer") as client, \
            Handler(settings).running() as handler:
        registered = await client.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope, "key": "k"}})
        assert registered == {"id": "t1"}
        await client.set(scope, "k", {"n": 1})
        await client.set(scope, "other", 1)
        await client.set(f"{scope}-b", "k", 1)
        await client.update(scope, "k", [{"type": "increment", "path": "n", "by": 1}])
        await client.delete(scope, "k")
        await until(lambda: len(handler.calls) >= 3, 5, "three handler calls")
        await client.set(scope, "k", "last")
        await until(lambda: len(handler.calls) >= 4, 5, "the fourth handler call")
        types = [body["event_type"] for _, body in handler.calls]
        assert types == ["state:created", "state:updated", "state:deleted", "state:created"]
        first_id, first = handler.calls[0]
        assert first_id.startswith("t1:p") and first_id.endswith(f":{first['revision']}")
        assert {k: first[k] for k in ("type", "scope", "key", "old_value", "new_value",
                                      "version", "by")} == {
            "type": "state", "scope": scope, "key": "k", "old_value": None,
            "new_value": {"n": 1}, "version": 1, "by": "writer"}
        assert first["ts"].endswith("Z")
        assert handler.calls[1][1]["old_value"] == {"n": 1}
        assert handler.calls[1][1]["new_value"] == {"n": 2}
        revisions = [body["revision"] for _, body in handler.calls]
        assert revisions == sorted(revisions, key=lambda r: tuple(map(int, r.split("-"))))
        assert len(handler.calls) == 4


async def test_key_prefix_event_types_and_match_filters(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        base = {"function_id": "reactor::on_change", "service": "reactor"}
        await client.call("state::register-trigger", {**base, "id": "prefix", "config": {
            "scope": scope, "key_prefix": "job-", "event_types": ["created"]}})
        await client.call("state::register-trigger", {**base, "id": "done", "config": {
            "scope": scope, "match": [{"pointer": "/new_value/status", "equals": "done"}]}})
        await client.set(scope, "job-1", {"status": "running"})  # prefix: created
        await client.set(scope, "job-1", {"status": "done"})  # done: match
        await client.set(scope, "task-1", {"status": "done"})  # done: match
        await client.set(scope, "task-2", {"status": "done ", "n": 1.0})  # none
        await client.set(scope, "job-2", {"status": 1})  # prefix: created
        await until(lambda: len(handler.calls) >= 4, 5, "four handler calls")
        got = [(call_id.split(":")[0], body["key"]) for call_id, body in handler.calls]
        assert got == [("prefix", "job-1"), ("done", "job-1"), ("done", "task-1"),
                       ("prefix", "job-2")]


async def test_a_rule_pointing_past_an_array_stops_no_other_trigger(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    """A match rule `/new_value/l/-` (RFC 6901: the element after the last, never there)
    matches nothing; it once raised while matching, so the partition's dispatch failed on
    that event again and again and every trigger of the partition stopped."""
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        base = {"function_id": "reactor::on_change", "service": "reactor"}
        await client.call("state::register-trigger", {**base, "id": "a-past", "config": {
            "scope": scope, "match": [{"pointer": "/new_value/l/-", "equals": 1}]}})
        await client.call("state::register-trigger", {**base, "id": "b-all", "config": {
            "scope": scope}})
        await client.set(scope, "k", {"l": [1]})
        await client.set(scope, "k2", 2)
        await until(lambda: len(handler.calls) >= 2, 10, "b-all's two handler calls")
        assert [(call_id.split(":")[0], body["key"]) for call_id, body in handler.calls] == [
            ("b-all", "k"), ("b-all", "k2")]


async def test_bad_registrations_name_the_field(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    async with StateClient(settings=settings_for(redis_server, prefix)) as client:
        base = {"function_id": "reactor::on_change", "service": "reactor"}
        # (body, error, details.path, a word the message must hold)
        cases: list[tuple[dict[str, Any], type[Exception], str, str]] = [
            ({"service": "reactor"}, InvalidRequest, "$.function_id", "function_id"),
            ({**base, "function_id": ""}, InvalidRequest, "$.function_id", "function_id"),
            ({**base, "config": {"event_types": ["created", "renamed"]}}, InvalidRequest,
             "$.config.event_types[1]", "config.event_types"),
            ({**base, "config": {"event_types": []}}, InvalidRequest, "$.config.event_types",
             "config.event_types"),
            ({**base, "config": {"match": [{"pointer": "status", "equals": 1}]}},
             InvalidRequest, "$.config.match[0].pointer", "config.match"),
            ({**base, "config": {"match": [{"pointer": "/a"}]}}, InvalidRequest,
             "$.config.match[0].equals", "equals"),
            ({**base, "config": {"scope": "state_barrier"}}, ReservedScope, "$.config.scope",
             "config.scope"),
            ({**base, "config": {"key": "k" * 1025}}, KeyTooLong, "$.config.key", "config.key"),
            ({**base, "config": {"condition_config": {"id": "b"}}}, InvalidRequest,
             "$.config.condition_function_id", "config.condition_function_id"),
            ({**base, "config": {"condition_function_id": "state::barrier"}}, InvalidRequest,
             "$.config.condition_config", "config.condition_config"),
            ({**base, "config": {"condition_function_id": "x::y",
                                 "condition_timeout_ms": 0}}, InvalidRequest,
             "$.config.condition_timeout_ms", "config.condition_timeout_ms"),
        ]
        for body, error, path, word in cases:
            with pytest.raises(error) as caught:
                await client.call("state::register-trigger", body)
            assert caught.value.details["path"] == path, (body, caught.value)
            assert word in str(caught.value), caught.value
        assert await client.call("state::list-triggers", {}) == {"triggers": []}


async def test_a_registration_is_at_most_64_kib_and_a_pointer_1024_bytes(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    """A match pointer over 1024 bytes, or a registration over 64 KiB of JSON (16 rules of
    8 KiB `equals`, each within its own limit): INVALID_REQUEST naming the field, the size and
    the limit, nothing registered; the largest allowed pointer registers."""
    async with StateClient(settings=settings_for(redis_server, prefix)) as client:
        base = {"function_id": "reactor::on_change", "service": "reactor"}
        with pytest.raises(InvalidRequest) as long_pointer:
            await client.call("state::register-trigger", {**base, "config": {
                "match": [{"pointer": "/" + "a" * 1024, "equals": 1}]}})
        assert long_pointer.value.details == {"path": "$.config.match[0].pointer",
                                              "size": 1025, "limit": 1024}
        assert "config.match[0].pointer is 1025 bytes" in str(long_pointer.value)
        rules = [{"pointer": f"/r{i}", "equals": "x" * 8192} for i in range(16)]
        with pytest.raises(InvalidRequest) as large:
            await client.call("state::register-trigger", {**base, "config": {"match": rules}})
        assert large.value.details["path"] == "$.config"
        assert large.value.details["limit"] == 64 * 1024
        assert large.value.details["size"] > 16 * 8192
        assert "limit of 65536" in str(large.value)
        assert await client.call("state::list-triggers", {}) == {"triggers": []}
        made = await client.call("state::register-trigger", {**base, "config": {
            "match": [{"pointer": "/" + "a" * 1023, "equals": 1}, *rules[:7]]}})
        listed = (await client.call("state::list-triggers", {}))["triggers"]
        assert [t["id"] for t in listed] == [made["id"]]


async def test_list_and_unregister(service: StateService, redis_server: RedisServer,
                                   prefix: str) -> None:
    async with StateClient(settings=settings_for(redis_server, prefix)) as client:
        made = await client.call("state::register-trigger", {
            "function_id": "f::g", "service": "f",
            "config": {"event_types": ["state:deleted", "deleted"]}})
        listed = (await client.call("state::list-triggers", {}))["triggers"]
        assert [t["id"] for t in listed] == [made["id"]]
        assert listed[0]["config"] == {"event_types": ["state:deleted"]}
        assert listed[0]["function_id"] == "f::g" and listed[0]["service"] == "f"
        assert await client.call("state::unregister-trigger", {"id": made["id"]}) == {
            "id": made["id"], "removed": True}
        assert await client.call("state::unregister-trigger", {"id": made["id"]}) == {
            "id": made["id"], "removed": False}
        assert await client.call("state::list-triggers", {}) == {"triggers": []}


async def test_unregistering_stops_delivery_on_every_replica(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as one, \
            StateService.running(settings, BusOptions(block_ms=50)) as two, \
            StateClient(settings=settings) as client, Handler(settings).running() as handler:
        dispatchers = [s.dispatcher for s in (one, two) if s.dispatcher is not None]
        await until(lambda: all(d.leases.held for d in dispatchers)
                    and sum(len(d.leases.held) for d in dispatchers) == 4, 10,
                    "both replicas holding partitions")
        shown = (await status_report(settings))["dispatch"]
        assert {p["holder"] for p in shown["partitions"]} == {d.replica for d in dispatchers}
        assert set(shown["replicas"]) == {d.replica for d in dispatchers}
        scopes = [f"{scope}-{i}" for i in range(8)]  # over every partition
        await client.call("state::register-trigger", {
            "id": "all", "function_id": "reactor::on_change", "service": "reactor"})
        for name in scopes:
            await client.set(name, "k", 1)
        await until(lambda: len(handler.calls) == 8, 5, "eight handler calls")
        await client.call("state::register-trigger", {
            "id": "marker", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"key": "marker"}})
        await client.call("state::unregister-trigger", {"id": "all"})
        await until(lambda: all(d.triggers.count == 1 for d in dispatchers), 1,
                    "every replica dropping the trigger within a second")
        # Its figures go with it (flushed first, then a reload prunes what is left).
        for dispatcher in dispatchers:
            await dispatcher.counts.flush()
            await dispatcher.reload_triggers()
        figures = await one.state.conn.execute("HGETALL", one.state.keys.dispatch_by_trigger)
        assert not [f for f in figures[::2] if f.startswith(b"all|")], figures
        for name in scopes:
            await client.set(name, "k", 2)
            await client.set(name, "marker", 0)  # after k in the same partition
        await until(lambda: len(handler.calls) == 16, 5, "eight marker calls")
        assert sorted(call_id.split(":")[0] for call_id, _ in handler.calls) == (
            ["all"] * 8 + ["marker"] * 8)


async def test_bus_conditions_only_an_explicit_false_skips(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    handler = Handler(settings)
    asked: list[str] = []

    @handler.worker.function("reactor::check")
    async def check(body: dict[str, Any], call: Call) -> Any:
        asked.append(body["key"])
        verdict = body["new_value"]
        if verdict == "raise":
            raise RuntimeError("the condition failed")
        if verdict == "slow":
            await anyio.sleep(1)  # past the trigger's condition timeout (0.2 s)
        return verdict

    async with StateClient(settings=settings) as client, handler.running():
        await client.call("state::register-trigger", {
            "id": "cond", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope, "condition_function_id": "reactor::check",
                       "condition_timeout_ms": 200}})
        verdicts: list[Any] = [True, False, None, 0, "raise", "slow", {"ok": False}, "no"]
        for index, verdict in enumerate(verdicts):
            await client.set(scope, f"k{index}", verdict)
        await until(lambda: len(asked) == len(verdicts), 10, "every condition asked")
        await client.set(scope, "last", True)
        await until(lambda: "last" in handler.delivered_keys(), 10, "the last event delivered")
        # Delivered: everything but an explicit false, an error and a timeout.
        assert handler.delivered_keys() == ["k0", "k2", "k3", "k6", "k7", "last"]
        assert service.dispatcher is not None

        async def counted() -> bool:
            assert service.dispatcher is not None
            await service.dispatcher.counts.flush()
            stats = await service.state.conn.execute(
                "HGETALL", service.state.keys.dispatch_stats)
            return dict(zip(stats[::2], stats[1::2], strict=True)).get(
                b"condition_errors") == b"2"
        await until(counted, 5, "two condition errors counted")
        # Per trigger (what `status` and the console show): its handler calls, and its last
        # condition error, the timeout of k5's (k4's error came before it).
        (shown,) = (await status_report(settings))["triggers"]
        assert shown["delivered"] == 6
        assert shown["last_error"]["code"] == "TIMEOUT", shown["last_error"]
        assert shown["last_error"]["condition"] == "reactor::check"
        revisions = [e.revision for e in await scope_events(
            service.state.conn, service.state.keys, scope)]
        assert shown["last_error"]["revision"] == revisions[5]


async def test_an_entry_that_is_not_an_event_is_skipped_not_fatal(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {
            "id": "all", "function_id": "reactor::on_change", "service": "reactor"})
        events = service.state.keys.for_scope(scope).events
        await service.state.conn.execute("XADD", events, "*", "keep", "me")
        await service.state.conn.execute("XADD", events, "*", "scope", scope, "type", "x")
        await client.set(scope, "k", 1)
        await until(lambda: handler.delivered_keys() == ["k"], 5, "the event after the junk")


async def test_triggers_never_see_private_or_reserved_scopes(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings, caller="vault") as client, \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {
            "id": "all", "function_id": "reactor::on_change", "service": "reactor"})
        await client.claim_namespace("vault", [f"{scope}-secret"])
        with pytest.raises(ReservedScope) as caught:
            await client.call("state::register-trigger", {
                "function_id": "reactor::on_change", "service": "reactor",
                "config": {"scope": f"{scope}-secret"}})
        assert caught.value.details["path"] == "$.config.scope"
        assert "vault" in str(caught.value)
        await client.call("vault::state::compare-and-set", {
            "scope": f"{scope}-secret", "key": "k", "value": 1})
        await client.call("state::barrier", {"event": {"key": "a"},
                                             "condition_config": {"id": scope, "expect": 2}})
        await client.set(scope, "after", 1)
        await until(lambda: handler.delivered_keys() == ["after"], 5, "the public event")
        assert [body["scope"] for _, body in handler.calls] == [scope]


async def test_a_barrier_condition_wakes_the_handler_once_with_every_result(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as client, \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {
            "id": "gate", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope, "condition_function_id": "state::barrier",
                       "condition_config": {"id": f"{scope}-gate", "expect": ["a", "b", "c"],
                                            "carry": "/new_value"}}})
        with pytest.raises(BarrierConfig) as caught:
            await client.call("state::register-trigger", {
                "function_id": "reactor::on_change", "service": "reactor",
                "config": {"condition_function_id": "state::barrier",
                           "condition_config": {"id": "x", "expect": 0}}})
        assert caught.value.details["path"].startswith("$.config.condition_config")
        async with anyio.create_task_group() as tg:
            for key, value in (("a", 1), ("x", 0), ("b", 2), ("a", 10)):
                tg.start_soon(client.set, scope, key, value)
        await client.set(scope, "c", {"n": 1.50})
        await client.set(scope, "b", 20)  # complete already: skipped
        await client.set(scope, "marker", 0)
        await until(_past(service, scope), 5, "the marker dispatched")
        await until(lambda: bool(handler.calls), 5, "the wake")
        assert len(handler.calls) == 1
        (_call_id, body) = handler.calls[0]
        assert body["key"] == "c"
        results = body["condition_payload"]["results"]
        assert results["c"] == {"n": 1.50} and results["b"] == 2
        assert results["a"] in (1, 10)


def _past(service: StateService, scope: str) -> Any:
    """A condition: the dispatcher's position in the scope's partition is past the scope's
    last event."""
    async def past() -> bool:
        assert service.dispatcher is not None
        part = service.state.keys.partition_of(scope)
        events = service.state.keys.partition(part).events
        last = await service.state.conn.execute("XREVRANGE", events, "+", "-", "COUNT", 1)
        position = service.dispatcher.positions.get(part)
        return bool(last) and position is not None and position.id == last[0][0].decode()
    return past


async def test_a_condition_slower_than_the_lease_keeps_it_and_delivers_once(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """A batch waiting on a slow bus condition renews its partition's lease: were the lease
    to lapse (lease_ms 500 here, the condition takes 1.6 s), the position could not move
    and the batch would be handed on again (a repeated condition call is answered from the
    checker's record, so only the handler's stream tells)."""
    settings = settings_for(redis_server, prefix, lease_ms=500)
    checker = Handler(settings, service="checker")
    asked: list[str] = []

    @checker.worker.function("checker::slow")
    async def slow(body: dict[str, Any], call: Call) -> bool:
        asked.append(call.id or "")
        await anyio.sleep(1.6)  # the condition service is slow: the behaviour under test
        return True

    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings) as client, checker.running(), \
            Handler(settings).running() as handler:
        await client.call("state::register-trigger", {
            "id": "slow", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope, "condition_function_id": "checker::slow",
                       "condition_service": "checker", "condition_timeout_ms": 5000}})
        await client.set(scope, "k", 1)
        await until(lambda: handler.delivered_keys() == ["k"], 10, "the handler call")
        keys = service.state.keys
        await until(lambda: all_dispatched(redis_server.client(), keys), 10,
                    "the position stored")
        handed_on = redis_server.client().xinfo_stream(f"{prefix}:bus:reactor")["entries-added"]
        assert handed_on == 1 and len(asked) == 1


async def test_a_slow_condition_holds_up_only_its_own_partition(
        redis_server: RedisServer, prefix: str) -> None:
    """A condition still running in one partition does not hold up the triggers of the
    others (one replica leases all four partitions here): the second write is handed on
    while the first one's condition is still waiting, and the first once it answers."""
    settings = settings_for(redis_server, prefix)
    keys = KeySpace(prefix, 4)
    slow_scope = "orders"
    fast_scope = next(f"users-{n}" for n in range(100)
                      if keys.partition_of(f"users-{n}") != keys.partition_of(slow_scope))
    checker = Gate(settings, answer=True)
    release, asked = checker.release, checker.asked

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client, checker.running(), \
            Handler(settings).running() as handler:
        for trigger_id, config in (
                ("gated", {"scope": slow_scope, "condition_function_id": "checker::gate",
                           "condition_service": "checker", "condition_timeout_ms": 60000}),
                ("plain", {"scope": fast_scope})):
            await client.call("state::register-trigger", {
                "id": trigger_id, "function_id": "reactor::on_change", "service": "reactor",
                "config": config})
        await client.set(slow_scope, "first", 1)
        with anyio.fail_after(10):
            await asked.wait()
        await client.set(fast_scope, "second", 2)
        await until(lambda: handler.delivered_keys() == ["second"], 10,
                    "the other partition's call while the condition waits")
        release.set()
        await until(lambda: handler.delivered_keys() == ["second", "first"], 10,
                    "the gated call once its condition answers")
