"""Dapr's state API shape on the HTTP face (app/dapr.py), with a real HTTP client: what Dapr's
state conformance checks of a store (get/set/delete with ETags, bulk, transactions, query),
a store being a scope and an ETag an entry's version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def dapr(redis_server: RedisServer, prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}/v1.0/state") as http:
        yield http


async def save(http: httpx.AsyncClient, store: str, *items: dict[str, Any]) -> httpx.Response:
    return await http.post(f"/{store}", content=msgspec.json.encode(list(items)))


async def test_save_get_delete_with_etags(dapr: httpx.AsyncClient, scope: str) -> None:
    saved = await dapr.post(f"/{scope}", content=b'[{"key":"a","value":{"n":1.50}},'
                                                 b'{"key":"b/c","value":"text"}]')
    assert saved.status_code == 204  # (the value kept as written: 1.50)
    got = await dapr.get(f"/{scope}/a")
    assert (got.status_code, got.content, got.headers["etag"]) == (200, b'{"n":1.50}', "1")
    assert (await dapr.get(f"/{scope}/b/c")).json() == "text"  # a key with a slash
    assert (await dapr.get(f"/{scope}/absent")).status_code == 204
    stale = await save(dapr, scope, {"key": "a", "value": 2, "etag": "7"})
    assert (stale.status_code, stale.json()["errorCode"]) == (409, "CONFLICT")
    assert (await save(dapr, scope, {"key": "a", "value": 2, "etag": "1"})).status_code == 204
    assert (await dapr.get(f"/{scope}/a")).headers["etag"] == "2"
    bad = await save(dapr, scope, {"key": "a", "value": 3, "etag": "W/x"})
    assert (bad.status_code, bad.json()["details"]["path"]) == (400, "$[0].etag")
    refused = await dapr.delete(f"/{scope}/a", headers={"If-Match": "1"})
    assert (refused.status_code, refused.json()["errorCode"]) == (409, "CONFLICT")
    assert (await dapr.delete(f"/{scope}/a", headers={"If-Match": "2"})).status_code == 204
    assert (await dapr.get(f"/{scope}/a")).status_code == 204
    assert (await dapr.delete(f"/{scope}/b/c")).status_code == 204
    assert (await dapr.delete(f"/{scope}/never")).status_code == 204  # as Dapr: no error


async def test_a_save_is_all_or_nothing_and_takes_a_ttl(dapr: httpx.AsyncClient,
                                                        scope: str) -> None:
    await save(dapr, scope, {"key": "x", "value": 1})
    refused = await save(dapr, scope, {"key": "y", "value": 1}, {"key": "x", "value": 2,
                                                                 "etag": "5"})
    assert refused.status_code == 409
    assert (await dapr.get(f"/{scope}/y")).status_code == 204  # nothing written
    assert (await save(dapr, scope, {"key": "t", "value": 1, "metadata": {
        "ttlInSeconds": "60"}})).status_code == 204
    bad = await save(dapr, scope, {"key": "t", "value": 1, "metadata": {"ttlInSeconds": "x"}})
    assert (bad.status_code, bad.json()["details"]["path"]) == (
        400, "$[0].metadata.ttlInSeconds")
    never = await save(dapr, scope, {"key": "t", "value": 2, "metadata": {"ttlInSeconds": "-1"}})
    assert never.status_code == 204  # Dapr's "never expire"
    too_big = b'[{"key":"b","value":"' + b"x" * 6 * 1024 * 1024 + b'"}]'
    refused = await dapr.post(f"/{scope}", content=too_big)
    assert (refused.status_code, refused.json()["errorCode"]) == (413, "VALUE_TOO_LARGE")
    assert refused.json()["details"]["path"] == "body"  # refused as read, not by a value's check


async def test_bulk_get(dapr: httpx.AsyncClient, scope: str) -> None:
    await save(dapr, scope, {"key": "a", "value": [1]}, {"key": "b", "value": None})
    response = await dapr.post(f"/{scope}/bulk", json={"keys": ["a", "missing", "b"],
                                                       "parallelism": 4})
    assert response.status_code == 200
    assert response.json() == [{"key": "a", "data": [1], "etag": "1"}, {"key": "missing"},
                               {"key": "b", "data": None, "etag": "1"}]


async def test_a_transaction_applies_all_or_nothing(dapr: httpx.AsyncClient,
                                                    scope: str) -> None:
    await save(dapr, scope, {"key": "gone", "value": 1}, {"key": "kept", "value": 1})

    def tx(*operations: dict[str, Any]) -> dict[str, Any]:
        return {"operations": list(operations), "metadata": {}}

    stale = await dapr.post(f"/{scope}/transaction", json=tx(
        {"operation": "upsert", "request": {"key": "new", "value": {"a": 1}}},
        {"operation": "delete", "request": {"key": "kept", "etag": "9"}}))
    assert stale.status_code == 409
    assert (await dapr.get(f"/{scope}/new")).status_code == 204
    done = await dapr.post(f"/{scope}/transaction", json=tx(
        {"operation": "upsert", "request": {"key": "new", "value": {"a": 1}}},
        {"operation": "delete", "request": {"key": "gone", "etag": "1"}},
        {"operation": "upsert", "request": {"key": "kept", "value": 2, "etag": "1"}}))
    assert done.status_code == 204
    assert (await dapr.get(f"/{scope}/new")).json() == {"a": 1}
    assert (await dapr.get(f"/{scope}/gone")).status_code == 204
    assert (await dapr.get(f"/{scope}/kept")).headers["etag"] == "2"
    odd = await dapr.post(f"/{scope}/transaction", json=tx(
        {"operation": "merge", "request": {"key": "x"}}))
    assert (odd.status_code, odd.json()["details"]["path"]) == (
        400, "$.operations[0].operation")


async def test_query_with_filters_and_pages(dapr: httpx.AsyncClient, scope: str) -> None:
    people = [{"key": f"p{i}", "value": {"state": "CA" if i % 2 else "WA",
                                         "person": {"org": f"o{i % 3}"}}} for i in range(9)]
    await save(dapr, scope, *people)
    base = str(dapr.base_url).rstrip("/").replace("/v1.0/state", "/v1.0-alpha1/state")

    async def query(body: dict[str, Any]) -> dict[str, Any]:
        response = await dapr.post(f"{base}/{scope}/query", json=body)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    found = await query({"filter": {"EQ": {"state": "CA"}}})
    assert [r["key"] for r in found["results"]] == ["p1", "p3", "p5", "p7"]
    assert found["results"][0] == {"key": "p1", "data": people[1]["value"], "etag": "1"}
    both = await query({"filter": {"AND": [{"EQ": {"state": "CA"}},
                                           {"IN": {"person.org": ["o1", "o2"]}}]}})
    assert [r["key"] for r in both["results"]] == ["p1", "p5", "p7"]
    first = await query({"filter": {}, "page": {"limit": 4}})
    assert [r["key"] for r in first["results"]] == ["p0", "p1", "p2", "p3"]
    rest = await query({"filter": {}, "page": {"limit": 10, "token": first["token"]}})
    assert [r["key"] for r in rest["results"]] == [f"p{i}" for i in range(4, 9)]
    assert "token" not in rest
    refused = await dapr.post(f"{base}/{scope}/query", json={"filter": {"OR": []}})
    assert (refused.status_code, refused.json()["details"]["path"]) == (400, "$.filter")
    for odd in ({"AND": ["a"]}, {"AND": [1]}, [], {"EQ": {"a": 1}, "IN": {}}):
        refused = await dapr.post(f"{base}/{scope}/query", json={"filter": odd})
        assert refused.status_code == 400 and refused.json()["errorCode"] == "INVALID_REQUEST"
