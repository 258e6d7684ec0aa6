"""What the HTTP face's tests share: a state service with the face (`served`, or `serving`
for other settings), a call through it (`post`), a /metrics page's samples, and Dapr's
paths (`dapr`: a client of `/v1.0/state` over the stores `<scope>` and `spread=<scope>-*`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.servers import RedisServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def http_settings(url: str, prefix: str, **more: Any) -> Settings:
    return Settings(redis_url=url, prefix=prefix, partitions=4, http="127.0.0.1:0", **more)


@asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[StateService, httpx.AsyncClient]]:
    """A state service with its HTTP face, and a client of the face."""
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        yield service, http


@pytest.fixture
async def served(redis_server: RedisServer, prefix: str
                 ) -> AsyncIterator[tuple[StateService, httpx.AsyncClient]]:
    async with serving(http_settings(redis_server.url, prefix)) as both:
        yield both


@pytest.fixture
async def acl_served(acl_redis: RedisServer, prefix: str) -> AsyncIterator[StateService]:
    """A state service in `acl` mode with its HTTP face, on a Redis of the module's own."""
    settings = Settings(redis_url=acl_redis.url, prefix=prefix, partitions=4, auth="acl",
                        http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        yield service


async def post(http: httpx.AsyncClient, fn: str, body: Any, **headers: str
               ) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    response = await http.post(f"/v1/call/{fn}", content=data, headers=headers)
    assert response.headers["content-type"] == "application/json"
    return response.status_code, msgspec.json.decode(response.content)


def samples(text: str) -> Samples:
    """Every sample of a /metrics page, parsed by the Prometheus client's own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
async def dapr(redis_server: RedisServer, prefix: str, scope: str
               ) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0", dapr_stores=f"{scope},spread={scope}-*")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}/v1.0/state") as http:
        yield http


async def save(http: httpx.AsyncClient, store: str, *items: dict[str, Any]) -> httpx.Response:
    return await http.post(f"/{store}", content=msgspec.json.encode(list(items)))


def refusal(response: httpx.Response) -> tuple[int, str, str | None]:
    """(status, Dapr's errorCode, our own code in its ErrorInfo details)."""
    body = response.json()
    details = body.get("details") or [{}]
    return response.status_code, body["errorCode"], details[0].get("reason")


async def entry(dapr: httpx.AsyncClient, scope: str, key: str) -> dict[str, Any]:
    """The native entry (its expiry, its version) through /v1/call."""
    base = str(dapr.base_url).rstrip("/").replace("/v1.0/state", "")
    answer = await dapr.post(f"{base}/v1/call/state::get-entry",
                             json={"scope": scope, "key": key})
    result: dict[str, Any] = answer.json()["result"]
    return result
