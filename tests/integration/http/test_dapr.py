"""Dapr's state API shape on the HTTP face (app/dapr.py), with a real HTTP client: what Dapr's
state conformance checks of a store (get/set/delete with ETags, bulk, transactions, query),
a store being a scope and an ETag an entry's version."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from tests.integration.http.conftest import entry, refusal, save

pytestmark = pytest.mark.anyio


async def test_save_get_delete_with_etags(dapr: httpx.AsyncClient, scope: str) -> None:
    saved = await dapr.post(f"/{scope}", content=b'[{"key":"a","value":{"n":1.50}},'
                                                 b'{"key":"b/c","value":"text"}]')
    assert saved.status_code == 204  # (the value kept as written: 1.50)
    got = await dapr.get(f"/{scope}/a")
    assert (got.status_code, got.content, got.headers["etag"]) == (200, b'{"n":1.50}', "1")
    assert (await dapr.get(f"/{scope}/b/c")).json() == "text"  # a key with a slash
    assert (await dapr.get(f"/{scope}/absent")).status_code == 204
    stale = await save(dapr, scope, {"key": "a", "value": 2, "etag": "7"})
    assert refusal(stale) == (409, "ERR_STATE_SAVE", "CONFLICT")
    assert (await save(dapr, scope, {"key": "a", "value": 2, "etag": "1"})).status_code == 204
    assert (await dapr.get(f"/{scope}/a")).headers["etag"] == "2"
    bad = await save(dapr, scope, {"key": "a", "value": 3, "etag": "W/x"})
    assert refusal(bad) == (400, "ERR_STATE_SAVE", None) and "$[0].etag" in bad.json()["message"]
    refused = await dapr.delete(f"/{scope}/a", headers={"If-Match": "1"})
    assert refusal(refused) == (409, "ERR_STATE_DELETE", "CONFLICT")
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
    assert refusal(bad) == (400, "ERR_MALFORMED_REQUEST", None)
    assert "$[0].metadata.ttlInSeconds" in bad.json()["message"]
    never = await save(dapr, scope, {"key": "t", "value": 2, "metadata": {"ttlInSeconds": "-1"}})
    assert never.status_code == 204  # Dapr's "never expire"
    too_big = b'[{"key":"b","value":"' + b"x" * 6 * 1024 * 1024 + b'"}]'
    refused = await dapr.post(f"/{scope}", content=too_big)
    assert refusal(refused) == (413, "ERR_MALFORMED_REQUEST", "VALUE_TOO_LARGE")
    # refused as read, not by a value's check
    assert refused.json()["details"][0]["metadata"]["path"] == "body"


async def test_bulk_get(dapr: httpx.AsyncClient, scope: str) -> None:
    await save(dapr, scope, {"key": "a", "value": [1]}, {"key": "b", "value": None})
    response = await dapr.post(f"/{scope}/bulk", json={"keys": ["a", "missing", "b"],
                                                       "parallelism": 4})
    assert response.status_code == 200
    assert response.json() == [{"key": "a", "data": [1], "etag": "1"}, {"key": "missing"},
                               {"key": "b", "data": None, "etag": "1"}]
    # a key asked twice (native get-many takes each key once): read once, given twice
    twice = await dapr.post(f"/{scope}/bulk", json={"keys": ["a", "missing", "a"]})
    assert twice.status_code == 200
    assert twice.json() == [{"key": "a", "data": [1], "etag": "1"}, {"key": "missing"},
                            {"key": "a", "data": [1], "etag": "1"}]


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
    assert refusal(odd) == (400, "ERR_NOT_SUPPORTED_STATE_OPERATION", None)
    assert "$.operations[0].operation" in odd.json()["message"]


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
    assert refusal(refused) == (400, "ERR_MALFORMED_REQUEST", None)
    assert "$.filter.OR" in refused.json()["message"]
    for odd in ({"AND": ["a"]}, {"AND": [1]}, [], {"EQ": {"a": 1}, "IN": {}}):
        refused = await dapr.post(f"{base}/{scope}/query", json={"filter": odd})
        assert refusal(refused) == (400, "ERR_MALFORMED_REQUEST", None), odd


async def test_health_metadata_and_the_configured_stores(dapr: httpx.AsyncClient,
                                                         scope: str) -> None:
    base = str(dapr.base_url).rstrip("/").replace("/state", "")
    for path in ("/healthz", "/healthz/outbound"):
        assert (await dapr.get(f"{base}{path}")).status_code == 204
    metadata = (await dapr.get(f"{base}/metadata")).json()
    assert metadata["id"] == "stateworker"
    assert sorted(c["name"] for c in metadata["components"]) == sorted([scope, "spread"])
    assert all(c["type"] == "state.stateworker" and "ETAG" in c["capabilities"]
               and "TRANSACTIONAL" in c["capabilities"] for c in metadata["components"])
    typo = await save(dapr, f"{scope}x", {"key": "a", "value": 1})
    assert refusal(typo) == (400, "ERR_STATE_STORE_NOT_FOUND", None)
    assert f"{scope}x" in typo.json()["message"] and scope in typo.json()["message"]
    assert refusal(await dapr.get(f"/{scope}x/a"))[1] == "ERR_STATE_STORE_NOT_FOUND"
    assert (await entry(dapr, f"{scope}x", "a"))["found"] is False  # no scope made


async def test_put_url_metadata_options_and_unknown_fields(dapr: httpx.AsyncClient,
                                                           scope: str) -> None:
    put = await dapr.put(f"/{scope}?metadata.ttlInSeconds=60&metadata.contentType="
                         "application/json", json=[
                             {"key": "u", "value": 1, "options": {"consistency": "strong",
                                                                  "concurrency": "first-write"}},
                             {"key": "v", "value": 2, "metadata": {"ttlInSeconds": "-1"}}])
    assert put.status_code == 204, put.text
    assert (await entry(dapr, scope, "u"))["expires_at"] is not None  # the URL's ttl
    # ... over the item's -1 too: the URL's metadata wins, as in Dapr (test_dapr_metadata.py)
    assert (await entry(dapr, scope, "v"))["expires_at"] is not None
    for body in ([{"key": "w", "value": 1, "etga": "1"}],
                 [{"key": "w", "value": 1, "options": {"consistency": "strongest"}}],
                 [{"value": 1}]):
        refused = await dapr.post(f"/{scope}", json=body)
        assert refusal(refused) == (400, "ERR_MALFORMED_REQUEST", None), body
    assert (await dapr.get(f"/{scope}/w")).status_code == 204
    assert (await dapr.put(f"/{scope}/bulk", json={"keys": ["u"]})).json()[0]["data"] == 1


async def test_a_transaction_applies_its_operations_in_order(dapr: httpx.AsyncClient,
                                                            scope: str) -> None:
    """Dapr's rule (its conformance test): operations in order, all or nothing."""
    await save(dapr, scope, {"key": "key1", "value": 1}, {"key": "key2", "value": 1})
    done = await dapr.put(f"/{scope}/transaction", json={"operations": [
        {"operation": "delete", "request": {"key": "key1"}},
        {"operation": "upsert", "request": {"key": "key2", "value": 2}},
        {"operation": "delete", "request": {"key": "key2"}},
        {"operation": "upsert", "request": {"key": "key3", "value": 3}}]})
    assert done.status_code == 204, done.text
    assert [(await dapr.get(f"/{scope}/{k}")).status_code for k in ("key1", "key2", "key3")] \
        == [204, 204, 200]
    # A later operation's ETag is checked against what the earlier ones made of the key.
    chained = await dapr.post(f"/{scope}/transaction", json={"operations": [
        {"operation": "upsert", "request": {"key": "key3", "value": 4}},
        {"operation": "upsert", "request": {"key": "key3", "value": 5, "etag": "2"}}]})
    assert chained.status_code == 204, chained.text
    assert (await dapr.get(f"/{scope}/key3")).json() == 5
    stale = await dapr.post(f"/{scope}/transaction", json={"operations": [
        {"operation": "upsert", "request": {"key": "new", "value": 1}},
        {"operation": "delete", "request": {"key": "key3"}},
        {"operation": "upsert", "request": {"key": "key3", "value": 6, "etag": "3"}}]})
    assert refusal(stale)[:2] == (409, "ERR_STATE_TRANSACTION")  # deleted before: no etag holds
    assert (await dapr.get(f"/{scope}/new")).status_code == 204  # nothing written
    assert (await dapr.get(f"/{scope}/key3")).json() == 5


async def test_query_with_or_and_sort(dapr: httpx.AsyncClient, scope: str) -> None:
    people = [{"key": f"p{i}", "value": {"state": "CA" if i % 2 else "WA", "id": 10 - i,
                                         "person": {"org": f"o{i % 3}"}}} for i in range(9)]
    await save(dapr, scope, *people)
    base = str(dapr.base_url).rstrip("/").replace("/v1.0/state", "/v1.0-alpha1/state")
    body = {"filter": {"OR": [{"EQ": {"person.org": "o0"}},
                              {"AND": [{"EQ": {"state": "CA"}}, {"IN": {"person.org": ["o1"]}}]}]},
            "sort": [{"key": "state", "order": "DESC"}, {"key": "id"}], "page": {"limit": 3}}
    first = (await dapr.put(f"{base}/{scope}/query", json=body)).json()
    # o0: p0 p3 p6; CA and o1: p1 p7. WA first (DESC), then by id ascending.
    assert [r["key"] for r in first["results"]] == ["p6", "p0", "p7"]
    rest = (await dapr.post(f"{base}/{scope}/query", json={
        **body, "page": {"limit": 3, "token": first["token"]}})).json()
    assert [r["key"] for r in rest["results"]] == ["p3", "p1"] and "token" not in rest
    above = (await dapr.post(f"{base}/{scope}/query", json={
        "filter": {"GT": {"id": 7}}, "sort": [{"key": "id", "order": "DESC"}]})).json()
    assert [r["key"] for r in above["results"]] == ["p0", "p1", "p2"]


async def test_a_sort_key_it_cannot_read_is_refused_naming_its_index(
        dapr: httpx.AsyncClient, scope: str) -> None:
    base = str(dapr.base_url).rstrip("/").replace("/v1.0/state", "/v1.0-alpha1/state")
    refused = await dapr.post(f"{base}/{scope}/query", json={
        "filter": {}, "sort": [{"key": "id"}, {"key": "a" * 5000}]})
    assert refused.status_code == 400, refused.text
    error = refused.json()
    assert error["errorCode"] == "ERR_MALFORMED_REQUEST", error
    assert error["details"][0]["metadata"] == {"path": "$.sort[1].key", "limit": "1024"}, error


async def test_a_store_spanning_scopes_keys_by_app(dapr: httpx.AsyncClient, scope: str) -> None:
    """`spread={scope}-*`: a key `<app>||<key>` is the key in the scope `{scope}-<app>`."""
    assert (await save(dapr, "spread", {"key": "a||k", "value": 1})).status_code == 204
    assert (await entry(dapr, f"{scope}-a", "k"))["value"] == 1
    assert (await dapr.get("/spread/a||k")).json() == 1
    assert (await dapr.post("/spread/bulk", json={"keys": ["a||k", "b||k"]})).json() == [
        {"key": "a||k", "data": 1, "etag": "1"}, {"key": "b||k"}]
    mixed = await save(dapr, "spread", {"key": "a||x", "value": 1}, {"key": "b||x", "value": 1})
    assert refusal(mixed) == (400, "ERR_MALFORMED_REQUEST", None)
    plain = await save(dapr, "spread", {"key": "k", "value": 1})
    assert refusal(plain)[:2] == (400, "ERR_MALFORMED_REQUEST") and "||" in plain.json()["message"]



async def test_a_bulk_get_over_a_store_spanning_scopes_is_capped(
        dapr: httpx.AsyncClient) -> None:
    """A bulk get reads at most 1,000 keys, as native get-many does, whichever scopes they
    name: over a store spanning scopes each scope is a call, so 5,000 keys in 5,000 scopes
    were 5,000 calls from one request. Refused before any, as Dapr refuses."""
    over = await dapr.post("/spread/bulk", json={"keys": [f"a{i}||k" for i in range(1001)]})
    assert refusal(over) == (400, "ERR_STATE_BULK_GET", "INVALID_REQUEST")
    assert "at most 1000 keys, got 1001" in over.json()["message"]
    assert over.json()["details"][0]["metadata"] == {"path": "$.keys", "size": "1001",
                                                     "limit": "1000"}
    most = await dapr.post("/spread/bulk", json={"keys": [f"a{i}||k" for i in range(1000)]})
    assert most.status_code == 200 and len(most.json()) == 1000

@pytest.mark.parametrize(("where", "number"), [
    ("etag", "²"), ("etag", "9" * 5000), ("if-match", "²"), ("ttl", "²"), ("ttl", "9" * 5000),
    ("ttl-url", "9" * 5000), ("token", "²")])
async def test_numbers_in_other_digits_or_too_long_are_refused_not_crashed(
        dapr: httpx.AsyncClient, scope: str, where: str, number: str) -> None:
    """What `str.isdigit` takes and `int` refuses (a superscript, 5,000 digits): Dapr's 400 for
    that field, never the server's 500."""
    await save(dapr, scope, {"key": "k", "value": 1})
    if where == "etag":
        refused = await save(dapr, scope, {"key": "k", "value": 2, "etag": number})
        code, field = "ERR_STATE_SAVE", "$[0].etag"
    elif where == "if-match":
        refused = await dapr.delete(f"/{scope}/k", headers=[(b"If-Match", number.encode("latin-1")
                                                             if len(number) == 1 else number.encode())])
        code, field = "ERR_STATE_DELETE", "If-Match"
    elif where == "ttl":
        refused = await save(dapr, scope, {"key": "k", "value": 2,
                                           "metadata": {"ttlInSeconds": number}})
        code, field = "ERR_MALFORMED_REQUEST", "$[0].metadata.ttlInSeconds"
    elif where == "ttl-url":
        refused = await dapr.post(f"/{scope}?metadata.ttlInSeconds={number}",
                                  content=b'[{"key":"k","value":2}]')
        code, field = "ERR_MALFORMED_REQUEST", "ttlInSeconds"
    else:
        query = str(dapr.base_url).rstrip("/").replace("/v1.0/", "/v1.0-alpha1/") + f"/{scope}/query"
        refused = await dapr.post(query, content=msgspec.json.encode(
            {"filter": {}, "sort": [{"key": "a"}], "page": {"token": number}}))
        code, field = "ERR_MALFORMED_REQUEST", "$.page.token"
    assert refusal(refused)[:2] == (400, code), refused.text
    assert field in refused.json()["message"]
    assert (await dapr.get(f"/{scope}/k")).json() == 1  # nothing written
