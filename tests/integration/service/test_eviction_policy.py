"""A Redis that may evict the service's keys, set while the service runs (CONFIG SET): the
start refuses one (test_lost_redis.py); a running service must say so too, not wait for its
next start. A server of the test's own: the policy is server-wide."""

from __future__ import annotations

import httpx
import pytest
import redis

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


async def test_a_policy_that_cannot_be_read_again_keeps_the_service_unready(
        own_redis: RedisServer, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once Redis was seen to evict, a check that gets no answer (INFO refused by an ACL of
    the operator's) cannot say the policy was fixed: /readyz stays 503 until one can."""
    monkeypatch.setattr(lifecycle, "EVICTION_CHECK_S", 0.1)
    admin = own_redis.client()
    admin.execute_command("ACL", "SETUSER", "admin", "on", ">admin-pw", "~*", "&*", "+@all")
    with redis.Redis.from_url(own_redis.url, username="admin", password="admin-pw") as raw:
        await unready_while_unread(raw, own_redis.url, prefix)


async def unready_while_unread(raw: redis.Redis, url: str, prefix: str) -> None:
    async with StateService.running(http_settings(url, prefix),
                                    BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        raw.config_set("maxmemory", 512 * 1024 * 1024)
        raw.config_set("maxmemory-policy", "volatile-lru")

        async def unready() -> bool:
            return (await http.get("/readyz")).status_code == 503
        await until(unready, 10, "/readyz to see the eviction policy")
        raw.execute_command("ACL", "SETUSER", "default", "-info")
        raw.config_set("maxmemory-policy", "noeviction")
        raw.execute_command("ACL", "LOG", "RESET")

        def refused_info() -> int:
            return sum(entry.get("count", 1) for entry in raw.acl_log()
                       if entry.get("object") == "info")
        await until(lambda: refused_info() >= 2, 10, "two checks refused INFO")
        assert (await http.get("/readyz")).status_code == 503
        raw.execute_command("ACL", "SETUSER", "default", "+info")

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200
        await until(ready, 10, "/readyz to be ready again")
