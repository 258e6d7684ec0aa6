"""state::on-config-change: the live settings (max_value_bytes, triggers_enabled) reloaded on
every replica of a running service from the overrides in Redis; a bad stored value keeps the
settings in force and is reported; paused triggers hand nothing on and lose nothing."""

from __future__ import annotations

import pytest
import redis

from stateworker import StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.keys import KeySpace
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.services import settings_for
from tests.integration.snapshots import all_dispatched
from tests.integration.state.test_claims_replicas import replicas
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
CHANGE = "state::on-config-change"


async def refuses_large(store: StateStore, scope: str, size: int) -> bool:
    try:
        await store.set(scope, "big", "x" * size)
    except StateError as exc:
        assert exc.code == "VALUE_TOO_LARGE", exc
        return True
    return False


async def test_max_value_bytes_changes_on_every_replica(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    async with replicas(redis_server, prefix, 2) as (first, second):
        one, two = StateStore(first.state), StateStore(second.state)
        assert not await refuses_large(two, scope, 200)
        changed = await one.call(CHANGE, {"max_value_bytes": 100})
        assert changed == {"ok": True, "max_value_bytes": 100, "triggers_enabled": True}
        assert await refuses_large(one, scope, 200)  # the replica that served it: at once
        await until(lambda: refuses_large(two, scope, 200), 5, "the second replica to reload")
        assert two.settings.max_value_bytes == 100  # the typed face's check too
        restored = await two.call(CHANGE, {"max_value_bytes": None})
        assert restored["max_value_bytes"] == 1024 * 1024
        await until(lambda: first.state.settings.max_value_bytes == 1024 * 1024, 5,
                    "the first replica to go back to its start value")
        assert not await refuses_large(one, scope, 200)


async def test_a_bad_stored_value_keeps_the_settings_and_is_reported(
        redis_server: RedisServer, prefix: str, store: StateStore,
        caplog: pytest.LogCaptureFixture) -> None:
    await store.call(CHANGE, {"max_value_bytes": 300})
    with pytest.raises(StateError) as bad_request:
        await store.call(CHANGE, {"max_value_bytes": 10 * 1024 * 1024})  # > max_call_bytes / 2
    assert bad_request.value.code == "INVALID_REQUEST"
    assert "max_call_bytes" in bad_request.value.message
    redis_server.client().hset(store.state.keys.live_settings, "max_value_bytes", "lots")
    with pytest.raises(StateError) as refused:
        await store.call(CHANGE, {})
    assert refused.value.code == "INVALID_REQUEST" and "lots" in refused.value.message
    assert store.state.settings.max_value_bytes == 300
    await store.state.live.reload()  # what every other replica's follower does
    assert store.state.settings.max_value_bytes == 300
    assert "lots" in (store.state.live.problem or "")
    assert [r for r in caplog.records if getattr(r, "event", "") == "settings.refused"]
    repaired = await store.call(CHANGE, {"max_value_bytes": None})
    assert repaired["max_value_bytes"] == 1024 * 1024 and store.state.live.problem is None


def heartbeat(client: redis.Redis, keys: KeySpace) -> float:
    (beat,) = client.zrange(keys.replicas, 0, 0, withscores=True)
    return float(beat[1])


async def test_paused_triggers_hand_nothing_on_and_lose_nothing(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    client, keys = redis_server.client(), KeySpace(prefix, 4)
    async with StateClient(settings=settings, caller="writer") as writer, \
            Handler(settings).running() as handler:
        await writer.call("state::register-trigger", {
            "id": "t1", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await writer.set(scope, "k0", 0)
        await until(lambda: len(handler.calls) == 1, 10, "the first delivery")
        assert (await writer.call(CHANGE, {"triggers_enabled": False}))["triggers_enabled"] is False
        for i in range(1, 4):
            await writer.set(scope, f"k{i}", i)
        # three dispatcher rounds after the writes: an active one would have handed them on
        beat = heartbeat(client, keys)
        for _ in range(3):
            await until(lambda b=beat: heartbeat(client, keys) > b, 10, "a dispatcher round")
            beat = heartbeat(client, keys)
        assert len(handler.calls) == 1 and not all_dispatched(client, keys)
        await writer.call(CHANGE, {"triggers_enabled": None})
        await until(lambda: len(handler.calls) == 4, 10, "the waiting events handed on")
        assert handler.delivered_keys() == ["k0", "k1", "k2", "k3"]
        await until(lambda: all_dispatched(client, keys), 10, "every event dispatched")
