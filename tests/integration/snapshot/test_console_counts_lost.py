"""The console's key counts (`GET /v1/console/counts`) of a prefix whose Redis lost its data,
before and while a restore brings it back, asked from the browser's side: a scope PostgreSQL
holds must not count 0 keys because Redis has not loaded it (yet). The count is refused with
STORE_LOST naming the prefix, as every read function is (test_reads_during_restore.py); once
restored, the counts are PostgreSQL's again."""

from __future__ import annotations

import httpx
import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.state import lifecycle
from tests.integration.busproto import until
from tests.integration.snapshot.test_reads_during_restore import (
    PARTITIONS,
    VALUES,
    drop_prefix,
    held_restore,
    seeded,
)
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

COUNTS = "/v1/console/counts?scope=s&scope=i"


def refused(response: httpx.Response, prefix: str, running: bool) -> None:
    assert response.status_code == 503, (response.status_code, response.text)
    error = msgspec.json.decode(response.content)["error"]
    assert error["code"] == "STORE_LOST", error
    assert error["details"]["prefix"] == prefix, error
    assert ("a restore of it is running" in error["message"]) == running, error


async def test_console_counts_are_refused_while_redis_lost_the_prefix(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000, http="127.0.0.1:0")
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    whole = {"s": len(VALUES), "i": len(VALUES)}
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        await seeded(store)
        assert (await http.get(COUNTS)).json() == whole
        await until(lambda: caught_up(client, keys), 30, "the snapshot")

        drop_prefix(client, prefix)  # lost, no restore yet
        refused(await http.get(COUNTS), prefix, running=False)
        assert (await http.get("/v1/console/counts")).json() == {}  # (no scope: nothing read)

        async with lifecycle.open_state(settings=settings, reaper=False) as state, \
                held_restore(monkeypatch, state, postgres_url) as go_on:
            refused(await http.get(COUNTS), prefix, running=True)
            await go_on()
        assert (await http.get(COUNTS)).json() == whole
