"""What Dapr's state API says of an item's metadata, against a running service (app/dapr.py):
when an item with a TTL expires (`ttlExpireTime`, Dapr 1.12+: a get's `metadata.ttlExpireTime`
header, a bulk get item's `metadata`), none for an item without one; and which
`ttlInSeconds` wins when the URL, an item and a transaction each give one (decision 0065)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import httpx
import pytest

from tests.integration.http.conftest import entry, save

pytestmark = pytest.mark.anyio

RFC3339_SECONDS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")  # Go's time.RFC3339 in UTC


async def bulk(dapr: httpx.AsyncClient, scope: str, *keys: str) -> list[dict[str, Any]]:
    response = await dapr.post(f"/{scope}/bulk", json={"keys": list(keys)})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()
    return items


async def expires(dapr: httpx.AsyncClient, scope: str, key: str) -> str | None:
    """The `ttlExpireTime` a bulk get gives `key` (None: it gives no metadata)."""
    item = (await bulk(dapr, scope, key))[0]
    assert item["key"] == key and "data" in item, item
    return item.get("metadata", {}).get("ttlExpireTime")


async def test_a_read_says_when_an_item_with_a_ttl_expires(dapr: httpx.AsyncClient,
                                                           scope: str) -> None:
    saved = await save(dapr, scope, {"key": "t", "value": 1, "metadata": {"ttlInSeconds": "3600"}},
                       {"key": "p", "value": 2})
    assert saved.status_code == 204, saved.text
    stored = dt.datetime.fromisoformat((await entry(dapr, scope, "t"))["expires_at"])
    got = await dapr.get(f"/{scope}/t")
    assert (got.status_code, got.json(), got.headers["etag"]) == (200, 1, "1")
    header = got.headers["metadata.ttlExpireTime"]
    # as Dapr's stores write it: RFC 3339 in UTC, to the second (the entry's expiry, cut)
    assert RFC3339_SECONDS.fullmatch(header), header
    assert dt.datetime.fromisoformat(header) == stored.replace(microsecond=0)
    kept = await dapr.get(f"/{scope}/p")
    assert kept.status_code == 200 and "metadata.ttlExpireTime" not in kept.headers
    assert await bulk(dapr, scope, "t", "p", "gone") == [
        {"key": "t", "data": 1, "etag": "1", "metadata": {"ttlExpireTime": header}},
        {"key": "p", "data": 2, "etag": "1"}, {"key": "gone"}]
    # saved again with -1 (Dapr's "never expire"): nothing says it expires any more
    await save(dapr, scope, {"key": "t", "value": 3, "metadata": {"ttlInSeconds": "-1"}})
    assert "metadata.ttlExpireTime" not in (await dapr.get(f"/{scope}/t")).headers
    assert await expires(dapr, scope, "t") is None


async def test_the_urls_ttl_wins_over_an_items(dapr: httpx.AsyncClient, scope: str) -> None:
    """Dapr's runtime copies the URL's `metadata.*` over each item's metadata (its
    onPostState): a URL's `ttlInSeconds=-1` keeps an item saying 60 from expiring, and a
    URL's 60 makes an item saying -1 expire."""
    url_never = await dapr.post(f"/{scope}?metadata.ttlInSeconds=-1", json=[
        {"key": "a", "value": 1, "metadata": {"ttlInSeconds": "60"}}])
    assert url_never.status_code == 204, url_never.text
    assert await expires(dapr, scope, "a") is None
    url_ttl = await dapr.put(f"/{scope}?metadata.ttlInSeconds=60", json=[
        {"key": "b", "value": 1, "metadata": {"ttlInSeconds": "-1"}}, {"key": "c", "value": 1}])
    assert url_ttl.status_code == 204, url_ttl.text
    assert await expires(dapr, scope, "b") is not None
    assert await expires(dapr, scope, "c") is not None
    item_only = await save(dapr, scope, {"key": "d", "value": 1,
                                         "metadata": {"ttlInSeconds": "60"}})
    assert item_only.status_code == 204 and await expires(dapr, scope, "d") is not None


async def test_a_transactions_metadata_under_an_operations_under_the_urls(
        dapr: httpx.AsyncClient, scope: str) -> None:
    """A transaction's `metadata` applies to every operation that gives none of its own
    (Dapr's reference: "applies to all operations"); an operation's own wins over it; the
    URL's wins over both, as on a save."""
    def upsert(key: str, ttl: str | None = None) -> dict[str, Any]:
        request: dict[str, Any] = {"key": key, "value": 1}
        if ttl is not None:
            request["metadata"] = {"ttlInSeconds": ttl}
        return {"operation": "upsert", "request": request}

    done = await dapr.post(f"/{scope}/transaction", json={
        "operations": [upsert("shared"), upsert("own", "-1")],
        "metadata": {"ttlInSeconds": "60"}})
    assert done.status_code == 204, done.text
    assert await expires(dapr, scope, "shared") is not None
    assert await expires(dapr, scope, "own") is None
    url = await dapr.post(f"/{scope}/transaction?metadata.ttlInSeconds=-1", json={
        "operations": [upsert("u1"), upsert("u2", "60")], "metadata": {"ttlInSeconds": "60"}})
    assert url.status_code == 204, url.text
    assert [await expires(dapr, scope, k) for k in ("u1", "u2")] == [None, None]
