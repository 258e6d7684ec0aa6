"""Every live `stateworker serve` of a prefix serves with the same bus, shards, durability,
auth mode and snapshot (decision 0076): one started beside a live one with another value is
refused (LAYOUT_MISMATCH naming the setting, the live one's value and its own); once the live
ones stopped (a killed one: once its hold ran out) the new value serves, and what was written
before is read back, triggers, barriers and watches going on from where they were.

Found by attack: a `fast` service started beside a `strict` one on one prefix served the
same callers, acknowledging before the replicas a strict batch waits for; an `off` one beside
an `acl` one ran the shared stream's calls `acl` mode closes; one without PostgreSQL beside
one with it kept no call record for the snapshot (a retry after a restore applied twice).
All started without a word."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import LayoutMismatch
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state.layout import REPLICA
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio


@pytest.fixture
def strict_redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis", appendfsync="always")  # (strict may serve on it)
    server.start()
    yield server
    server.kill()


def settings_of(server: RedisServer, prefix: str, **extra: Any) -> Settings:
    return Settings(redis_url=server.url, prefix=prefix, partitions=4, lease_ms=1000, **extra)


def env_of(settings: Settings) -> dict[str, str]:
    env = {"STATEWORKER_DURABILITY": settings.durability, "STATEWORKER_LEASE_MS": "1000"}
    if settings.postgres_url:
        env["STATEWORKER_POSTGRES_URL"] = settings.postgres_url
    return env


async def refused(settings: Settings) -> LayoutMismatch:
    with pytest.raises(LayoutMismatch) as caught:
        async with StateService.running(settings, BusOptions(block_ms=50)):
            pass
    return caught.value


def holds_gone(server: RedisServer, prefix: str) -> bool:
    """No service's hold on the prefix's shared settings is live (Redis's clock)."""
    raw = server.client()
    seconds, micros = raw.time()
    now = seconds * 1000 + micros // 1000
    return all(msgspec.json.decode(value)["until"] < now
               for field, value in raw.hgetall(KeySpace(prefix, 4).serving).items()
               if field.startswith(REPLICA.encode()))


@pytest.mark.parametrize(("setting", "live", "given"), [
    ("durability", "strict", "fast"), ("durability", "fast", "strict"),
    ("auth", "off", "acl"), ("postgres_url", "on", "off")])
async def test_a_service_beside_a_live_one_of_another_value_is_refused(
        strict_redis: RedisServer, prefix: str, postgres_url: str, setting: str, live: str,
        given: str) -> None:
    def with_value(value: str) -> Settings:
        if setting == "postgres_url":
            return settings_of(strict_redis, prefix,
                               postgres_url=postgres_url if value == "on" else None)
        return settings_of(strict_redis, prefix, **{setting: value})

    async with StateService.running(with_value(live), BusOptions(block_ms=50)) as first:
        exc = await refused(with_value(given))
        assert exc.code == "LAYOUT_MISMATCH"
        assert exc.details == {"setting": setting, "stored": live, "given": given,
                               "prefix": prefix, "consumer": first.runtime.consumer}
        assert f"STATEWORKER_{setting.upper()}" in exc.message
        # The same value joins it.
        async with StateService.running(with_value(live), BusOptions(block_ms=50)):
            pass
    # Every service stopped: the new value serves (a restart with a changed setting).
    async with StateService.running(with_value(given), BusOptions(block_ms=50)):
        pass


async def test_two_started_at_once_with_other_durabilities_never_both_serve(
        strict_redis: RedisServer, prefix: str) -> None:
    served: list[str] = []
    refusals: list[LayoutMismatch] = []
    stop = anyio.Event()

    async def serve(durability: str) -> None:
        try:
            async with StateService.running(settings_of(strict_redis, prefix,
                                                        durability=durability),
                                            BusOptions(block_ms=50)):
                served.append(durability)
                await stop.wait()
        except LayoutMismatch as exc:
            refusals.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, "fast")
        tg.start_soon(serve, "strict")
        await until(lambda: len(served) + len(refusals) == 2, 30,
                    "both starts decided")
        stop.set()
    assert len(served) <= 1 and refusals
    assert all(exc.details["setting"] == "durability" for exc in refusals)


async def test_a_killed_service_holds_its_settings_until_its_hold_runs_out(
        strict_redis: RedisServer, prefix: str) -> None:
    strict = settings_of(strict_redis, prefix, durability="strict")
    service = ServiceProcess(strict_redis.url, prefix, env=env_of(strict))
    await anyio.to_thread.run_sync(service.start)
    service.kill()
    exc = await refused(msgspec.structs.replace(strict, durability="fast"))
    assert "a service killed counts as live" in exc.message
    await until(lambda: holds_gone(strict_redis, prefix), 30, "the killed one's hold gone")
    async with StateService.running(msgspec.structs.replace(strict, durability="fast"),
                                    BusOptions(block_ms=50)):
        pass


async def write_before(settings: Settings, scope: str) -> str:
    """Writes, a trigger, a barrier's first arrival (as a trigger's condition) and a watch's
    bookmark (the first write's revision), with no worker serving the trigger's calls."""
    async with StateClient(settings=settings, timeout=10) as client:
        for trigger, config in (("t1", {"scope": scope}), ("tb", {
                "scope": f"{scope}-b", "condition_function_id": "state::barrier",
                "condition_config": {"id": "bar", "expect": ["a", "b"]}})):
            await client.call("state::register-trigger", {
                "id": trigger, "function_id": "reactor::on_change", "service": "reactor",
                "config": config})
        await client.set(scope, "k1", 1)
        await client.set(f"{scope}-b", "a", 1)
        return str((await client.get_entry(scope, "k1"))["revision"])


async def read_after(settings: Settings, scope: str, revision: str) -> None:
    """Everything back: the value, the trigger's call handed on before delivered once with
    the new ones, the barrier completed once by its second arrival, the watch resumed."""
    async with StateClient(settings=settings, timeout=10) as client, \
            Handler(settings).running() as handler:
        assert await client.get(scope, "k1") == 1
        await client.set(scope, "k2", 2)
        await client.set(f"{scope}-b", "b", 1)
        await client.set(scope, "k3", 3)
        await until(lambda: {"k3", "b"} <= set(handler.delivered_keys()), 30, "deliveries")
        async with client.watch(scope, from_revision=revision) as events:
            async for event in events:
                assert getattr(event, "key", None) == "k2"
                break
        assert sorted(handler.delivered_keys()) == ["b", "k1", "k2", "k3"]


@pytest.mark.parametrize("stop", ["term", "kill"])
@pytest.mark.parametrize(("before", "after"), [
    ({"durability": "fast"}, {"durability": "strict"}),
    ({"durability": "strict"}, {"durability": "fast"}),
    ({"postgres_url": False}, {"postgres_url": True}),
    ({"postgres_url": True}, {"postgres_url": False})],
    ids=["fast-strict", "strict-fast", "snapshot-on", "snapshot-off"])
async def test_a_restart_with_a_changed_setting_reads_and_reacts_as_before(
        strict_redis: RedisServer, prefix: str, scope: str, postgres_url: str, stop: str,
        before: dict[str, Any], after: dict[str, Any]) -> None:
    def settings(changed: dict[str, Any]) -> Settings:
        url = postgres_url if changed.get("postgres_url") else None
        return settings_of(strict_redis, prefix, durability=changed.get("durability", "fast"),
                           postgres_url=url)

    first = ServiceProcess(strict_redis.url, prefix, env=env_of(settings(before)))
    await anyio.to_thread.run_sync(first.start)
    try:
        revision = await write_before(settings(before), scope)
    finally:
        if stop == "term":
            first.signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(first.wait) == 0
        else:
            first.kill()
    await until(lambda: holds_gone(strict_redis, prefix), 30, "the first one's hold gone")
    second = ServiceProcess(strict_redis.url, prefix, env=env_of(settings(after)))
    await anyio.to_thread.run_sync(second.start)
    try:
        await read_after(settings(after), scope, revision)
    finally:
        second.kill()
