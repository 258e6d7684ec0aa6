"""The bus on a Redis of its own (STATEWORKER_BUS_REDIS_URL, decision 0056): the service
serves set, get, compare-and-set and triggers with its state on a strict Redis and its call
streams and reply lists on another; no state script touches a bus key (the bus Redis holds
streams, reply lists and counters only, the state Redis none of them); a call retried by its
id after the bus Redis lost everything is applied once and answered the same."""

from __future__ import annotations

import re
import shutil
import signal
from typing import Any

import httpx
import pytest

from stateworker.app import service_user
from stateworker.app.cli import status_report
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, MissingPermission
from stateworker.settings import Settings
from tests.integration.acl_users import add_user, refusals
from tests.integration.busproto import until
from tests.integration.busredis.conftest import Pair
from tests.integration.handlers import Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def key_types(server: RedisServer, prefix: str) -> dict[str, str]:
    client = server.client()
    return {name.decode(): client.type(name).decode()
            for name in client.scan_iter(match=f"{prefix}*", count=1000)}


async def test_split_bus_serves_set_get_cas_and_triggers(pair: Pair, prefix: str,
                                                         scope: str) -> None:
    settings = pair.settings(prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=5) as client, \
            Handler(settings).running() as handler:
        assert service.state.split_bus
        await client.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await client.call("state::set", {"scope": scope, "key": "k", "value": {"n": 1}})
        assert await client.get(scope, "k") == {"n": 1}
        swap = await client.call("state::compare-and-set", {
            "scope": scope, "key": "k", "value": {"n": 2}, "expected": {"n": 1}})
        assert swap["swapped"] is True
        refused = await client.call("state::compare-and-set", {
            "scope": scope, "key": "k", "value": {"n": 3}, "expected": {"n": 1}})
        assert refused["swapped"] is False
        assert await client.get(scope, "k") == {"n": 2}
        await until(lambda: handler.delivered_keys() == ["k", "k"], 30, "both deliveries")
        # `stateworker status` reads the services from the bus's Redis and names it.
        report = await status_report(settings)
        assert report["bus_redis"]
        assert {"state", "reactor"} <= set(report["services"])

    bus = key_types(pair.bus, prefix)
    state = key_types(pair.state, prefix)
    # The bus Redis: the call streams (the state's, the handler's), the reply list (deleted
    # when the client closed), the counters, the handler's records of its calls and the set
    # of the triggers' targets (reactive/targets.py); nothing of the state.
    assert {kind for name, kind in bus.items() if ":done:" not in name} <= {
        "stream", "list", "hash", "set"}, bus
    assert {f"{prefix}:bus:state", f"{prefix}:bus:reactor"} <= set(bus), bus
    assert all(name.startswith((f"{prefix}:bus:", f"{prefix}:reply:", f"{prefix}:stats:",
                                f"{prefix}:dispatch:targets")) for name in bus), bus
    # The state Redis: no call stream, reply list, worker record or bus counter.
    assert not [name for name in state
                if name.startswith((f"{prefix}:bus:", f"{prefix}:reply:", f"{prefix}:stats:"))]
    assert any(":e:" in name for name in state)  # (the entry is there)


async def test_a_call_retried_after_the_bus_redis_lost_everything_is_applied_once(
        pair: Pair, prefix: str, scope: str, tmp_path: Any) -> None:
    settings = pair.settings(prefix)
    body = {"scope": scope, "key": "k", "ops": [{"type": "increment", "path": "n", "by": 1}]}
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=10) as client:
        await client.call("state::set", {"scope": scope, "key": "k", "value": {"n": 0}})
        first = await client.call("state::update", body, call_id="once-1")

        # The bus Redis dies and comes back on its port with nothing: no stream, no group,
        # no pending entry, no reply list.
        port = pair.bus.port
        pair.bus.kill()
        shutil.rmtree(pair.bus.directory)
        pair.bus.port = port
        pair.bus.start()
        assert pair.bus.client().dbsize() == 0

        again = await client.call("state::update", body, call_id="once-1")
        assert again == first
        assert await client.get(scope, "k") == {"n": 1}  # applied once
        entry = await client.call("state::get-entry", {"scope": scope, "key": "k"})
        assert entry["version"] == 2  # the set, the update: nothing more


async def test_the_split_is_refused_with_acl_mode_and_a_cluster(pair: Pair, prefix: str,
                                                                redis_cluster: Any) -> None:
    with pytest.raises(ConfigError, match=r"bus_redis_url \(STATEWORKER_BUS_REDIS_URL\) cannot "
                                          r"be used with auth acl"):
        Settings(redis_url=pair.state.url, bus_redis_url=pair.bus.url, auth="acl")
    settings = Settings(redis_url=redis_cluster.url, bus_redis_url=pair.bus.url, prefix=prefix,
                        partitions=4)
    with pytest.raises(ConfigError, match=r"cannot be used with a Redis Cluster"):
        async with StateService.running(settings):
            pass
    settings = pair.settings(prefix, bus_redis_url=redis_cluster.url)
    with pytest.raises(ConfigError, match=r"must name one Redis server, not a Redis Cluster"):
        async with StateService.running(settings):
            pass


async def test_a_bus_redis_that_may_evict_is_refused_at_start(pair: Pair, prefix: str) -> None:
    """The bus's Redis holds the reply lists and a Worker's call records, with expiries: a
    volatile policy under a maxmemory would evict them (a call run twice by its Worker)."""
    pair.bus.client().config_set("maxmemory-policy", "volatile-lru")
    pair.bus.client().config_set("maxmemory", 512 * 1024 * 1024)
    with pytest.raises(ConfigError, match=r"maxmemory-policy volatile-lru") as refused:
        async with StateService.running(pair.settings(prefix)):
            pass
    assert pair.bus.url.split("//")[-1] in str(refused.value)  # (the bus's Redis is named)
    pair.bus.client().config_set("maxmemory-policy", "noeviction")
    async with StateService.running(pair.settings(prefix)), \
            StateClient(settings=pair.settings(prefix), timeout=10) as client:
        assert (await client.call("state::set", {"scope": "s", "key": "k", "value": 1}))[
            "version"] == 1

def ups(metrics: str) -> dict[str, str]:
    """The `*redis_up` gauges of a /metrics page."""
    return {name: value for name, _, value in (line.partition(" ") for line in metrics.splitlines())
            if name in ("stateworker_redis_up", "stateworker_bus_redis_up")}


async def test_readiness_tells_a_dead_bus_redis(pair: Pair, prefix: str) -> None:
    """/readyz asks the bus's Redis too: with it gone no call comes in nor goes out, though
    the state's Redis answers; /metrics says which is down."""
    settings = pair.settings(prefix, http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        assert ups((await http.get("/metrics")).text) == {
            "stateworker_redis_up": "1.0", "stateworker_bus_redis_up": "1.0"}
        pair.bus.kill()
        unready = await http.get("/readyz")
        assert unready.status_code == 503
        reason = unready.json()["reason"]
        assert reason.startswith("the bus's Redis at") and str(pair.bus.port) in reason
        assert ups((await http.get("/metrics")).text) == {
            "stateworker_redis_up": "1.0", "stateworker_bus_redis_up": "0.0"}


async def test_the_service_users_rule_is_asked_of_the_bus_redis_too(
        pair: Pair, prefix: str, scope: str) -> None:
    """The bus's Redis is checked at start as the state's: a user there that lacks part of
    the rule refuses the start with the one line naming it (not a NOPERM the day a replica
    dies and its calls are reclaimed); with the whole rule on both, everything is served
    (replies published on the state's Redis too) and neither Redis refused anything."""
    rule = service_user.rule(prefix, strict=True)
    lacking = add_user(pair.bus, "svc-bus", [arg for arg in rule if arg != "+xautoclaim"])
    with pytest.raises(MissingPermission, match=re.escape("+xautoclaim")) as refused:
        async with StateService.running(pair.settings(prefix, bus_redis_url=lacking)):
            pass
    assert f"127.0.0.1:{pair.bus.port}" in str(refused.value)

    settings = pair.settings(prefix, redis_url=add_user(pair.state, "svc", rule),
                             bus_redis_url=add_user(pair.bus, "svc-bus", rule))
    for server in pair:
        with server.client() as admin:
            admin.execute_command("ACL", "LOG", "RESET")
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=pair.settings(prefix), timeout=5) as client:
        await client.set(scope, "k", {"n": 1})
        assert await client.get(scope, "k") == {"n": 1}
        assert client.published_replies == 2
    assert [refusals(server) for server in pair] == [[], []]


async def test_metrics_give_the_states_figures_while_the_bus_redis_hangs(
        pair: Pair, prefix: str) -> None:
    """A bus Redis that does not answer (stopped, not gone) is said to be down, and not asked
    for its streams' backlog: the state's figures still come (they were dropped with the
    backlog's wait before)."""
    settings = pair.settings(prefix, http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}", timeout=30) as http:
        assert "\nstateworker_triggers 0.0" in (await http.get("/metrics")).text
        assert pair.bus.process is not None
        pair.bus.process.send_signal(signal.SIGSTOP)
        try:
            page = (await http.get("/metrics")).text
        finally:
            pair.bus.process.send_signal(signal.SIGCONT)
        assert ups(page) == {"stateworker_redis_up": "1.0", "stateworker_bus_redis_up": "0.0"}
        assert "\nstateworker_triggers 0.0" in page
