"""The service's own Redis user: under exactly the rule of docs/security.md
(`service_user.rule`) the service serves every function, dispatches triggers (a barrier, a
condition over the bus), snapshots to PostgreSQL, reclaims a dead consumer's call, reaps, and
repairs a wiped Redis, and Redis refuses it nothing (its ACL LOG stays empty); with one
permission taken away, `stateworker serve` stops at once with one line naming it, exit 1.

The ACL users are the server's, shared by every client: these tests have a server of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import psycopg
import pytest
import redis.asyncio as aredis
from prometheus_client.parser import text_string_to_metric_families

from stateworker.app import service_user
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.bus.protocol import Call as BusCall
from stateworker.bus.worker import Worker
from stateworker.engines.catalog import CATALOG
from stateworker.errors import MissingPermission, StateError
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from stateworker.state.tenancy import principals
from tests.calls import EXPECTED_ERRORS, calls
from tests.integration.acl_users import PASSWORD, add_user, refusals
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]


def test_every_function_of_the_catalog_is_called() -> None:
    called = {fn for fn, _, _ in calls("p")}
    assert set(CATALOG.functions) <= called


class Reactor:
    """The triggers' service: `on_change` records the calls, `allow` is a bus condition."""

    def __init__(self, settings: Settings) -> None:
        self.calls: list[str] = []
        self.worker = Worker("reactor", settings=settings, options=BusOptions(block_ms=50))

        @self.worker.function("reactor::on_change")
        async def on_change(body: dict[str, Any], call: BusCall) -> None:
            self.calls.append(body["key"])

        @self.worker.function("reactor::allow")
        async def allow(body: dict[str, Any], call: BusCall) -> bool:
            return True


TRIGGERS = [
    ("plain", {"scope": "watched"}),
    ("barrier", {"scope": "watched", "condition_function_id": "state::barrier",
                 "condition_config": {"id": "gate", "expect": 1}}),
    ("condition", {"scope": "watched", "condition_function_id": "reactor::allow"}),
]


async def serve_everything(settings: Settings, admin: Settings, acl_redis: RedisServer) -> None:
    """Every function over the bus, the triggers, a dead consumer's call, the reaper."""
    keys = KeySpace(settings.prefix, settings.partitions)
    reactor = Reactor(admin)
    dead = aredis.Redis(port=acl_redis.port)
    # A call read by a consumer that then died: the service takes it over (XAUTOCLAIM).
    stream, reply = keys.bus_stream("state"), f"{settings.prefix}:reply:dead"
    await dead.xgroup_create(stream, "state", id="0", mkstream=True)
    await dead.xadd(stream, {"id": "orphan", "fn": "state::get",
                             "body": '{"scope":"s","key":"k"}', "reply": reply})
    assert await dead.xreadgroup("state", "dead-consumer", {stream: ">"}, count=1)
    async with StateService.running(settings, BusOptions(block_ms=50,
                                                         visibility_timeout_ms=500)) as service, \
            StateClient(settings=admin, timeout=30, caller="mine") as client, \
            anyio.create_task_group() as tg:
        await tg.start(reactor.worker.run)
        for fn, body, context in calls(settings.prefix):
            try:
                await client.call_json(fn, msgspec.json.encode(body), context=context)
            except StateError as exc:
                assert (fn, exc.code) in EXPECTED_ERRORS, (fn, exc.to_dict())
        for trigger_id, config in TRIGGERS:
            await client.call("state::register-trigger", {
                "id": trigger_id, "function_id": "reactor::on_change", "service": "reactor",
                "config": config})
        await client.call("state::set", {"scope": "watched", "key": "w", "value": 1})
        await until(lambda: len(reactor.calls) == 3, 20, "the three triggers' calls")
        got = await dead.blpop([reply], timeout=30)
        await dead.aclose()
        assert got is not None and b'"ok":true' in got[1]
        assert {"state", "reactor"} <= await backlogs_shown(service)
        with acl_redis.client() as raw:
            # The reaper deleted the expired entry (reads hid it already).
            entry = keys.for_scope("s").entry("s", "short")
            await until(lambda: not raw.exists(entry), 20, "the reaper")
            if settings.postgres_url:
                await until(lambda: caught_up(raw, keys), 30, "the snapshot")
            if settings.events_retain == 0:  # (a dispatcher's round, once a second, trims
                # below what it and the snapshot have passed: the first after they moved)
                await until(lambda: "cmdstat_xtrim" in raw.info("commandstats"), 30,
                            "the dispatcher's trimming")
        reactor.worker.stop()


async def backlogs_shown(service: StateService) -> set[str]:
    """The services whose call streams' backlog /metrics shows (it reads them with
    `xinfo|groups` and `xpending`)."""
    assert service.http_address
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        page = (await http.get("/metrics")).text
    return {sample.labels["service"] for family in text_string_to_metric_families(page)
            if family.name == "stateworker_bus_pending" for sample in family.samples}


async def test_the_service_serves_everything_under_exactly_its_rule(
        acl_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    url = add_user(acl_redis, "svc", service_user.rule(prefix))
    # (events_retain 0: the dispatcher trims what it and the snapshot have passed, XTRIM)
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, postgres_url=postgres_url,
                        reaper_interval_s=0.05, events_retain=0, http="127.0.0.1:0")
    admin = Settings(redis_url=acl_redis.url, prefix=prefix, partitions=4)
    with acl_redis.client() as raw:
        raw.execute_command("ACL", "LOG", "RESET")
    await serve_everything(settings, admin, acl_redis)
    with acl_redis.client() as raw:  # rare paths that ran (no other client runs these)
        ran = {name.removeprefix("cmdstat_") for name in raw.info("commandstats")}
    assert {"xtrim", "scan", "srandmember", "acl|dryrun"} <= ran
    with psycopg.connect(postgres_url) as pg:
        row = pg.execute("SELECT count(*) FROM sw_entries WHERE prefix = %s",
                         (prefix,)).fetchone()
    assert row is not None and row[0] > 0
    # Redis wiped: the repair at start rebuilds it from PostgreSQL, under the same user.
    with acl_redis.client() as raw:
        names = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
        raw.delete(*names)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=admin, timeout=30) as client:
        assert await client.call("state::get", {"scope": "s", "key": "k"}) == \
            {"n": 1, "tags": ["a", "b"]}
    assert refusals(acl_redis) == []


async def test_in_acl_mode_the_service_serves_principals_under_exactly_its_rule(
        acl_redis: RedisServer, prefix: str) -> None:
    """`acl` mode adds reading every principal's stream (its groups, reads, reclaims) and the
    console's sessions: all within the same rule; the principals are made by the operator's
    user."""
    url = add_user(acl_redis, "svc-acl", service_user.rule(prefix))
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, auth="acl",
                        http="127.0.0.1:0")
    with acl_redis.client() as raw:
        raw.execute_command("ACL", "LOG", "RESET")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        await principals.add_principal(service.state, "p-svc-acl", ["writer"], [])
        # (the record is the operator's: here through the service's state, whose user may
        # write it; the Redis user of the principal needs ACL SETUSER: the operator's)
        async with StateStore.open(acl_redis.url, prefix=prefix, partitions=4,
                                   reaper=False) as operator:
            await principals.set_user(operator.state, "p-svc-acl", PASSWORD)
        principal_url = f"redis://p-svc-acl:{PASSWORD}@127.0.0.1:{acl_redis.port}/0"
        as_principal = Settings(redis_url=principal_url, prefix=prefix, partitions=4,
                                auth="acl")
        async with StateClient(settings=as_principal, timeout=30) as client:
            await client.set("s", "k", 1)
            assert await client.get("s", "k") == 1
        async with httpx.AsyncClient(base_url=f"http://{service.http_address}") as browser:
            login = await browser.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": "p-svc-acl", "password": PASSWORD}))
            assert login.status_code == 200, login.text
            assert (await browser.get("/v1/console/session")).json()["principal"] == "p-svc-acl"
            assert (await browser.post("/v1/console/logout")).status_code == 200
    assert refusals(acl_redis) == []


async def test_strict_durability_needs_config_get_and_command_info(
        tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path / "strict", appendfsync="always")
    server.start()
    try:
        settings = Settings(redis_url=add_user(server, "plain", service_user.rule(prefix)),
                            prefix=prefix, partitions=4, durability="strict")
        with pytest.raises(MissingPermission, match=re.escape("+command|info")):
            async with StateService.running(settings):
                pass
        strict = service_user.rule(prefix, strict=True)
        settings = Settings(redis_url=add_user(server, "strict", strict), prefix=prefix,
                            partitions=4, durability="strict")
        admin = Settings(redis_url=server.url, prefix=prefix, partitions=4)
        with server.client() as raw:
            raw.execute_command("ACL", "LOG", "RESET")
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=admin, timeout=30) as client:
            await client.call("state::set", {"scope": "s", "key": "k", "value": 1})
        assert refusals(server) == []
    finally:
        server.kill()


def without(rule: list[str], *taken: str) -> list[str]:
    return [arg for arg in rule if arg not in taken]


def serve(url: str, prefix: str) -> subprocess.CompletedProcess[str]:
    """`stateworker serve` under `url` (it should stop at once: bounded by the timeout)."""
    return subprocess.run(
        [sys.executable, "-m", "stateworker", "--redis-url", url, "serve",
         "--log-level", "ERROR"],
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"},
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


@pytest.mark.parametrize("taken, named", [
    (["+xautoclaim"], "+xautoclaim"),  # run only when a consumer died
    (["+zscore"], "+zscore"),  # run only inside the Lua functions
    (["+function|load"], "+function|load"),
    (["+acl|dryrun"], "+acl|dryrun"),  # the check itself
    (["~{prefix}:*"], "~{prefix}:*"),  # the keys
])
def test_a_user_lacking_one_permission_gets_one_line_and_exit_1(
        acl_redis: RedisServer, prefix: str, taken: list[str], named: str) -> None:
    rule = without(service_user.rule(prefix), *(t.format(prefix=prefix) for t in taken))
    done = serve(add_user(acl_redis, "lacking", rule), prefix)
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert named.format(prefix=prefix) in lines[0]
    assert lines[0].startswith('stateworker: the Redis user "lacking"')
    assert "docs/security.md" in lines[0] and "stateworker acl-rule" in lines[0]
    assert PASSWORD not in done.stderr


def test_a_user_lacking_select_for_the_urls_database_gets_one_line(
        acl_redis: RedisServer, prefix: str) -> None:
    """SELECT is refused at connect, before the check can ask: the same one line."""
    rule = service_user.rule(prefix, select=True)
    assert "+select" in rule
    url = add_user(acl_redis, "noselect", without(rule, "+select"))
    done = serve(url.removesuffix("/0") + "/1", prefix)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        'stateworker: the Redis user "noselect" at redis://noselect:***@127.0.0.1:'
        f"{acl_redis.port}/1 lacks part of the service's ACL rule: +select; the whole rule is "
        "in docs/security.md, or run `stateworker acl-rule`"]


# Commands the code names that `serve` does not run (or runs only in a mode whose part of the
# rule is `rule`'s flags): each with where it runs.
NOT_SERVED = {
    "AUTH": "the login (every user may)",
    "SELECT": "the login, a URL with a database (rule(select=True))",
    "CONFIG": "strict durability (rule(strict=True): config|get; SET: the embedded Redis)",
    "COMMAND": "strict durability (rule(strict=True): command|info)",
    "WAITAOF": "strict durability on Redis 7.2+ (rule(strict=True, waitaof=True))",
    "WAIT": "strict durability, replicas confirm (rule(strict=True))",
    "XLEN": "`stateworker status` (the operator's user)",
    "TIME": "watches",
    "SUBSCRIBE": "a client's (transport/subscriber.py: replies published on the state's Redis)",
    "TYPE": "an argument (`status`'s SCAN ... TYPE stream)",
    "READONLY": "an error reply's first word",
    "SAVE": "`ACL SAVE` after `principal add` (app/admin.py: the operator's user)",
    "ROLE": "an argument name of `principal add --role`",
    "DISCARD": "cluster.py routes one with its transaction (a name compared, never sent)",
    "TTL": "a capability Dapr's /v1.0/metadata lists (app/dapr_requests.py), never sent",
}
ROUTER = "slots.py"  # its table names commands to find their keys; it sends none


def test_every_command_the_code_names_is_in_the_rule(redis_server: RedisServer) -> None:
    """Against drift: a command added to the code and not to the rule fails here (and the
    service would fail at start under the documented rule)."""
    with redis_server.client() as raw:
        known = {name.decode().upper() for name in raw.command_list()}
    package = ROOT / "stateworker"
    python = {word for path in package.rglob("*.py") if path.name != ROUTER
              for word in re.findall(r'"([A-Z]{3,})"', path.read_text())} & known
    lua = {word.upper() for path in package.rglob("*.lua")
           for word in re.findall(r"redis\.p?call\(\s*'(\w+)'", path.read_text())}
    granted = {arg[1:] for arg in service_user.rule("sw") if arg.startswith("+")}
    in_rule = {name.split("|")[0].upper() for name in granted}
    blocking_only = {"BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BZPOPMIN", "BZPOPMAX",
                     "BZMPOP"}  # (wire.py's table of blocking commands, not sent)
    assert lua - in_rule == set()
    # A command the rule grants by subcommand (xgroup|create ...): the subcommand a script
    # names must be granted itself (sweep.lua's XINFO CONSUMERS, XGROUP DELCONSUMER).
    by_part = {name.split("|")[0] for name in granted if "|" in name}
    lua_parts = {f"{command}|{part}".lower() for path in package.rglob("*.lua")
                 for command, part in re.findall(r"redis\.p?call\(\s*'(\w+)',\s*'(\w+)'",
                                                 path.read_text())
                 if command.lower() in by_part}
    assert lua_parts, "no script names a subcommand: the check below checks nothing"
    assert lua_parts - granted == set()
    assert python - in_rule - set(NOT_SERVED) - blocking_only == set()


async def test_a_noperm_met_during_the_start_is_the_same_one_line(
        acl_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A user whose key patterns cover the check's sample keys (one of each kind, partition 0)
    but not partition 1: the check passes, the repair at start of a wiped Redis meets NOPERM
    on partition 1's stream, and the start ends with the one line, not a traceback."""
    admin = Settings(redis_url=acl_redis.url, prefix=prefix, partitions=4,
                     postgres_url=postgres_url)
    keys = KeySpace(prefix, 4)
    async with StateService.running(admin, BusOptions(block_ms=50)), \
            StateClient(settings=admin, timeout=30) as client:
        await client.call("state::set", {"scope": "s", "key": "k", "value": 1})
        with acl_redis.client() as raw:
            await until(lambda: caught_up(raw, keys), 30, "the snapshot")
    with acl_redis.client() as raw:
        raw.delete(*raw.scan_iter(match=f"{prefix}:*", count=1000))
    samples = [f"~{prefix}:{name}" for name in (
        "meta", f"{{{prefix}:p0}}:*", f"{{{prefix}:reg}}:*", "bus:*", "reply:*", "stats:*",
        "callid:*", "replicas", "dispatch:targets")]
    rule = service_user.rule(prefix)
    narrow = [arg for arg in rule if arg != f"~{prefix}:*"] + samples
    settings = Settings(redis_url=add_user(acl_redis, "narrow", narrow), prefix=prefix,
                        partitions=4, postgres_url=postgres_url)
    with pytest.raises(MissingPermission) as refused:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            pass
    assert str(refused.value).startswith(
        f'the Redis user "narrow" at redis://narrow:***@127.0.0.1:{acl_redis.port}/0 lacks '
        f"part of the service's ACL rule: ~{prefix}:* (a key of")
    assert "\n" not in str(refused.value) and PASSWORD not in str(refused.value)


async def test_the_consoles_live_tail_runs_under_exactly_the_rule(
        acl_redis: RedisServer, prefix: str) -> None:
    """The tail is a Watch inside the service (MULTI/EXEC of a partition's reads): under the
    documented rule it streams the changes, and Redis refused the service nothing."""
    url = add_user(acl_redis, "svc", service_user.rule(prefix))
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, http="127.0.0.1:0")
    with acl_redis.client() as raw:
        raw.execute_command("ACL", "LOG", "RESET")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}", timeout=30) as http, \
            http.stream("GET", "/v1/console/tail?scope=tailed") as tail:
        await StateStore(service.state).set("tailed", "seen", 1)
        with anyio.fail_after(20):
            async for line in tail.aiter_lines():
                if "seen" in line:
                    break
    assert refusals(acl_redis) == []
