"""From a Dapr caller's side: what one request makes the service read and answer is bounded as
one native call is (`max_call_bytes` of values: the README's "What one caller can make the
service hold"), whatever Dapr's shape adds on top: a bulk get that asks one large key again and
again (native get-many counts each reading; the Dapr door read the key once and answered it
every time), or one key in each of many scopes of a store spanning scopes (a native get-many
each), and a query with `sort` or `OR`, which gathers every match before it sorts. Each is
refused whole, naming the field and the limit, in Dapr's shape with CALL_TOO_LARGE in its
ErrorInfo; within the bound the same requests are answered. And a body nested deeper than the
decoder goes is refused naming the limit, as the call API refuses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.codec import MAX_DEPTH
from tests.integration.http.conftest import http_settings, refusal, save
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

VALUE_BYTES = 16 * 1024
CALL_BYTES = 2 * VALUE_BYTES  # the smallest bound the settings take: a test of small values
BLOB = "x" * 10_000  # three such values fit the bound, four do not


@pytest.fixture
async def dapr(redis_server: RedisServer, prefix: str, scope: str
               ) -> AsyncIterator[httpx.AsyncClient]:
    settings = http_settings(redis_server.url, prefix, dapr_stores=f"{scope},spread={scope}-*",
                             max_value_bytes=VALUE_BYTES, max_call_bytes=CALL_BYTES)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}/v1.0/state") as http:
        yield http


def too_large(response: httpx.Response, code: str, path: str) -> dict[str, str]:
    """The refusal's ErrorInfo metadata, checked: 413, Dapr's `code`, CALL_TOO_LARGE at
    `path`, the limit named in the message and the details."""
    assert response.status_code == 413, (response.status_code, len(response.content))
    assert refusal(response) == (413, code, "CALL_TOO_LARGE"), response.text
    body = response.json()
    metadata: dict[str, str] = body["details"][0]["metadata"]
    assert metadata["path"] == path and metadata["limit"] == str(CALL_BYTES), body
    assert int(metadata["size"]) > CALL_BYTES, body
    assert str(CALL_BYTES) in body["message"] and "max_call_bytes" in body["message"], body
    return metadata


async def bulk(dapr: httpx.AsyncClient, store: str, keys: list[str]) -> httpx.Response:
    return await dapr.post(f"/{store}/bulk", content=msgspec.json.encode({"keys": keys}))


async def query(dapr: httpx.AsyncClient, store: str, body: bytes | dict[str, Any]
                ) -> httpx.Response:
    data = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return await dapr.post(f"{root(dapr)}/v1.0-alpha1/state/{store}/query", content=data)


def root(dapr: httpx.AsyncClient) -> str:
    return str(dapr.base_url).split("/v1.0/state")[0]


async def test_a_bulk_get_answers_no_more_than_one_native_call_reads(
        dapr: httpx.AsyncClient, scope: str) -> None:
    assert (await save(dapr, scope, {"key": "big", "value": BLOB})).status_code == 204
    stored = len(msgspec.json.encode(BLOB))
    # the same key three times: answered three times, within the bound
    within = await bulk(dapr, scope, ["big", "nope", "big", "big"])
    assert within.status_code == 200, within.text
    assert [item.get("data") for item in within.json()] == [BLOB, None, BLOB, BLOB]
    # a fourth time: refused at that key, nothing answered (before: 200 and every copy,
    # 1,000 copies of a 1 MiB value from a request of a few KB)
    over = await bulk(dapr, scope, ["big", "nope", "big", "big", "big"])
    assert int(too_large(over, "ERR_STATE_BULK_GET", "$.keys[4]")["size"]) == 4 * stored
    # the native call asked the same is refused the same
    native = await dapr.post(f"{root(dapr)}/v1/call/state::get-many",
                             json={"scope": scope, "keys": ["big", "nope", "big", "big", "big"]})
    assert native.status_code == 413, native.text
    assert native.json()["error"]["details"] == {"path": "$.keys[4]", "size": 4 * stored,
                                                 "limit": CALL_BYTES}


async def test_a_bulk_get_over_scopes_answers_no_more_than_one_native_call_reads(
        dapr: httpx.AsyncClient) -> None:
    keys = [f"app{n}||big" for n in range(4)]  # one scope each: each native read is small
    for key in keys:  # (a save writes one scope)
        assert (await save(dapr, "spread", {"key": key, "value": BLOB})).status_code == 204
    within = await bulk(dapr, "spread", keys[:3])
    assert within.status_code == 200 and [i["data"] for i in within.json()] == [BLOB] * 3
    too_large(await bulk(dapr, "spread", keys), "ERR_STATE_BULK_GET", "$.keys[3]")


async def test_a_sorted_query_gathers_no_more_than_one_native_call_reads(
        dapr: httpx.AsyncClient, scope: str) -> None:
    for n in range(3):
        assert (await save(dapr, scope, {"key": f"k{n}", "value": {"n": n, "b": BLOB}})
                ).status_code == 204
    bodies: list[dict[str, Any]] = [
        {"filter": {}, "sort": [{"key": "n", "order": "DESC"}]},
        {"filter": {"OR": [{"EQ": {"n": 0}}, {"GTE": {"n": 1}}]}}]
    for body in bodies:  # within the bound: the whole scope, in order
        within = await query(dapr, scope, body)
        assert within.status_code == 200, within.text
        found = [r["key"] for r in within.json()["results"]]
        assert sorted(found) == ["k0", "k1", "k2"], found
        if "sort" in body:
            assert found == ["k2", "k1", "k0"]
    assert (await save(dapr, scope, {"key": "k3", "value": {"n": 3, "b": BLOB}})).status_code == 204
    for body in bodies:  # (before: 200, every value of the scope in one answer)
        too_large(await query(dapr, scope, body), "ERR_STATE_QUERY", "$.filter")
    # without sort and OR it is one native query, paged as it reads: answered
    paged = await query(dapr, scope, {"filter": {"GTE": {"n": 0}}})
    assert paged.status_code == 200 and "token" in paged.json(), paged.text


async def test_a_body_nested_past_the_decoder_is_refused_naming_the_limit(
        dapr: httpx.AsyncClient, scope: str) -> None:
    deep = b'{"filter":' + b'{"AND":[' * 3000 + b"{}" + b"]}" * 3000 + b"}"
    answer = await query(dapr, scope, deep)
    assert refusal(answer) == (400, "ERR_MALFORMED_REQUEST", "INVALID_REQUEST"), answer.text
    body = answer.json()
    assert body["details"][0]["metadata"] == {"path": "$", "limit": str(MAX_DEPTH)}, body
    assert f"the limit is {MAX_DEPTH}" in body["message"], body
