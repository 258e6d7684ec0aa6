"""A bus call applied on a Redis whose clock ran ahead, retried after a restore onto one whose
clock reads earlier (another host, a clock set back): the retry gets the recorded reply and
is not applied again.

A call's record lives in the time slice of the clock of the process that ran it (Redis's,
decision 0004), and a retry looks in its own slice and the four before it (records.lua). The
process of before is put ahead of Redis's clock by two dedupe windows (its readings of TIME
refused), as it is when the Redis it followed ran ahead. Found by attack: the restore put
each record back in its slice, ahead of every slice a retry looks in, and an `increment`
retried with the same call id was applied a second time (`n` 2, version 2)."""

from __future__ import annotations

import msgspec
import pytest

from stateworker import StateClient, StateStore, clock
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import restore_command
from tests.integration.snapshots import calls_saved
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_retry_after_a_restore_onto_a_clock_behind_is_not_applied_again(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    body = {"scope": "orders", "key": "o-1",
            "ops": [{"type": "increment", "path": "n", "by": 1}]}
    with monkeypatch.context() as ahead:
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings) as bus:
            assert clock._offset_ns is not None  # (anchored to Redis's clock)
            ahead.setattr(clock, "anchor", lambda *reading: False)
            ahead.setattr(clock, "_offset_ns",
                          clock._offset_ns + 2 * settings.dedupe_window_ms * 1_000_000)
            first = await bus.call("state::update", body, call_id="late-1")
            await until(lambda: calls_saved(client, keys), 60,
                        "the snapshot and the call record to catch up")
    assert (first["new_value"], first["version"]) == ({"n": 1}, 1)

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)  # (on Redis's clock)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["calls"] == 1

    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as bus:
        assert await bus.call("state::update", body, call_id="late-1") == first
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            entry = await store.get_entry("orders", "o-1")
            assert (entry.value, entry.version) == ({"n": 1}, 1)
            assert await store.events("orders") == []  # (the retry wrote no event)
