"""A Redis that may evict the service's keys, set while the service runs (CONFIG SET): the
start refuses one (test_lost_redis.py); a running service must say so too, not wait for its
next start. A server of the test's own: the policy is server-wide."""

from __future__ import annotations

import httpx
import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.state import lifecycle
from tests.integration.busproto import until
from tests.integration.http.conftest import http_settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_policy_that_evicts_set_while_serving_makes_the_service_unready(
        own_redis: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "EVICTION_CHECK_S", 0.1)
    async with StateService.running(http_settings(own_redis.url, prefix),
                                    BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        assert (await http.get("/readyz")).status_code == 200
        raw = own_redis.client()
        raw.config_set("maxmemory", 512 * 1024 * 1024)
        raw.config_set("maxmemory-policy", "volatile-lru")

        async def unready() -> bool:
            return (await http.get("/readyz")).status_code == 503
        await until(unready, 10, "/readyz to see the eviction policy")
        answer = (await http.get("/readyz")).text
        assert "maxmemory-policy volatile-lru" in answer and "noeviction" in answer, answer
        raw.config_set("maxmemory-policy", "noeviction")

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200
        await until(ready, 10, "/readyz to be ready again")
