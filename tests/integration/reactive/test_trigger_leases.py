"""Leased triggers against the running service: an expired trigger delivers nothing written
after it expired and is gone from list-triggers, from PostgreSQL's copy and from a restore;
keep-trigger extends it past its first expiry."""

from __future__ import annotations

from typing import Any

import msgspec
import psycopg
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.clock import epoch_ms, now_ms
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.integration.snapshot.test_restore import restore_command
from tests.integration.snapshots import all_dispatched
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ON_CHANGE = {"function_id": "reactor::on_change", "service": "reactor"}


async def listed(client: StateClient) -> dict[str, dict[str, Any]]:
    return {t["id"]: t for t in (await client.list_triggers())["triggers"]}


async def test_an_expired_trigger_delivers_nothing_and_a_kept_one_goes_on(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    keys, redis = KeySpace(prefix, 4), redis_server.client()
    async with StateClient(settings=settings, timeout=30) as client, \
            Handler(settings).running() as leased, \
            Handler(settings, "witness").running() as witness:
        await client.register_trigger(**ON_CHANGE, id="lapses", ttl_ms=500,
                                      config={"scope": scope, "key": "lapses"})
        await client.register_trigger(**ON_CHANGE, id="kept", ttl_ms=500,
                                      config={"scope": scope, "key": "kept"})
        await client.register_trigger("witness::on_change", "witness", id="witness",
                                      config={"scope": scope})
        first = await listed(client)
        await client.keep_trigger("kept", ttl_ms=60_000)
        await client.set(scope, "lapses", "before")  # written while both are live
        await until(lambda: leased.delivered_keys() == ["lapses"], 10, "the first delivery")

        # Past the first expires_at of both: the kept one goes on, the other is gone.
        ends = max(epoch_ms(first[t]["expires_at"]) for t in ("lapses", "kept"))
        await until(lambda: now_ms() > ends, 10, "the first leases to pass")
        gone = await listed(client)
        assert sorted(gone) == ["kept", "witness"]
        assert epoch_ms(gone["kept"]["expires_at"]) > ends
        await client.set(scope, "lapses", "after")
        await client.set(scope, "kept", "after")
        await until(lambda: len(witness.calls) == 3 and all_dispatched(redis, keys), 10,
                    "the witness's three calls, every event dispatched")
        assert leased.delivered_keys() == ["lapses", "kept"]
        assert leased.calls[1][1]["new_value"] == "after"
        await until(lambda: not redis.hexists(keys.triggers, "lapses"), 10, "the reaper")
        assert redis.zrange(keys.trigger_leases, 0, -1) == [b"kept"]


def sw_triggers(postgres_url: str, prefix: str) -> dict[str, str | None]:
    """PostgreSQL's copy: trigger id -> its expires_at (None: not leased)."""
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT id, registration FROM sw_triggers WHERE prefix = %s",
                            (prefix,)).fetchall()
    return {str(i): msgspec.json.decode(str(r)).get("expires_at") for i, r in rows}


async def test_postgresql_follows_an_expiry_and_a_restore_never_brings_one_back(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    redis = own_redis.client()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        await client.register_trigger(**ON_CHANGE, id="plain")
        for name in ("long", "gone", "short"):
            await client.register_trigger(**ON_CHANGE, id=name, ttl_ms=3_600_000)
        await until(lambda: len(sw_triggers(postgres_url, prefix)) == 4, 30,
                    "the four triggers in PostgreSQL")
        await client.keep_trigger("gone", ttl_ms=500)  # expires in half a second
        await until(lambda: sw_triggers(postgres_url, prefix).keys() == {"plain", "long",
                                                                       "short"}, 30,
                    "the expired trigger gone from PostgreSQL")
        short = (await client.keep_trigger("short", ttl_ms=5_000))["expires_at"]
        await until(lambda: sw_triggers(postgres_url, prefix)["short"] == short, 30,
                    "the renewal in PostgreSQL")
        long_expires = epoch_ms((await listed(client))["long"]["expires_at"])
    # The service stopped (nothing reaps): PostgreSQL still holds "short" when it expires.
    await until(lambda: now_ms() > epoch_ms(short), 30, "the short lease to pass")
    assert sw_triggers(postgres_url, prefix).keys() == {"plain", "long", "short"}

    redis.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["triggers"] == 2
    keys = KeySpace(prefix, 4)
    assert sorted(redis.hkeys(keys.triggers)) == [b"long", b"plain"]
    assert redis.zrange(keys.trigger_leases, 0, -1, withscores=True) == [(b"long",
                                                                          long_expires)]
