"""`status`'s snapshot part while PostgreSQL is away and after: the last error is shown with
its time while the snapshot cannot commit, and is gone once the snapshot has caught up (a
snapshot that works shows no error of the past)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.settings import Settings
from stateworker.snapshot.status import snapshot_status
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up
from tests.servers import PostgresServer, RedisServer

pytestmark = pytest.mark.anyio


async def test_the_last_error_shows_with_its_time_and_is_cleared_once_caught_up(
        redis_server: RedisServer, prefix: str, postgres_server: PostgresServer,
        postgres_url: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    client = redis_server.client()
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(settings=settings) as store:
        keys = store.state.keys

        async def shown() -> dict[str, Any]:
            report = await snapshot_status(store.state.conn, keys)
            assert report is not None
            return report

        await store.set("orders", "o-1", 1)
        await until(lambda: caught_up(client, keys), 60, "the snapshot to catch up")
        assert (await shown())["last_error"] is None

        stopped_ms = now_ms()
        postgres_server.stop()
        try:
            await store.set("orders", "o-2", 2)  # a write PostgreSQL lacks

            async def an_error() -> bool:
                return (await shown())["last_error"] is not None

            await until(an_error, 30, "`status` to show the snapshot's error")
            report = await shown()
            assert "PostgreSQL" in report["last_error"]
            at_ms = int(datetime.fromisoformat(report["last_error_at"]).timestamp() * 1000)
            assert stopped_ms <= at_ms <= now_ms()
            assert report["last_error_ms_ago"] >= 0
        finally:
            postgres_server.start()

        async def recovered() -> bool:
            return caught_up(client, keys) and (await shown())["last_error"] is None

        await until(recovered, 60, "the snapshot to catch up and its error to be cleared")
        report = await shown()
        assert report["last_error_at"] is None and report["last_error_ms_ago"] is None
        assert all(p["lag_events"] == 0 for p in report["partitions"])
