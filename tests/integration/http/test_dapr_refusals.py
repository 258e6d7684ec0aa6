"""A Dapr request's refusal names the field the Dapr caller sent (app/dapr_fields.py), never
the native function's it runs as (`$.ops[j]` of state::transaction, `$.keys[n]` of
state::get-many, `$.where[n]` of state::query), in Dapr's error shape with our stable code
in its ErrorInfo, against a running service."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from stateworker.settings import Settings
from tests.integration.http.conftest import refusal, save

pytestmark = pytest.mark.anyio

LONG_KEY = "k" * (Settings().max_key_bytes + 1)  # (the dapr fixture's limits: the defaults)
BIG_VALUE = "x" * (Settings().max_value_bytes + 1)


def named(response: httpx.Response) -> tuple[str, str]:
    """(the message, the path in the details): each must name the Dapr field."""
    body = response.json()
    assert "ops[" not in body["message"] and "$.where" not in body["message"], body
    return body["message"], body["details"][0]["metadata"]["path"]


async def test_a_saves_refusals_name_its_items(dapr: httpx.AsyncClient, scope: str) -> None:
    long_key = await save(dapr, scope, {"key": "a", "value": 1}, {"key": LONG_KEY, "value": 1})
    assert refusal(long_key) == (400, "ERR_STATE_SAVE", "KEY_TOO_LONG")
    message, path = named(long_key)
    assert path == "$[1].key" and message.startswith(
        f"failed saving state in state store {scope}: $[1].key is 1025 bytes, more than the "
        "limit of 1024 bytes"), message
    # a key named twice is one native op: its value the last item's, its condition the first's
    big = await save(dapr, scope, {"key": "b", "value": 1}, {"key": "a", "value": 1},
                     {"key": "b", "value": BIG_VALUE})
    assert refusal(big) == (413, "ERR_STATE_SAVE", "VALUE_TOO_LARGE")
    assert named(big)[1] == "$[2].value"
    await save(dapr, scope, {"key": "a", "value": 1})
    stale = await save(dapr, scope, {"key": "b", "value": 1},
                       {"key": "a", "value": 2, "etag": "9"}, {"key": "a", "value": 3})
    assert refusal(stale) == (409, "ERR_STATE_SAVE", "CONFLICT")
    message, path = named(stale)
    assert path == "$[1]" and "possible etag mismatch: $[1] " in message, message
    for bad, field in ((f"/{scope}?metadata.ttlInSeconds=x", "metadata.ttlInSeconds"),
                       (f"/{scope}?metadata.ttlInSeconds=315360001", "metadata.ttlInSeconds")):
        refused = await dapr.post(bad, json=[{"key": "a", "value": 1,
                                              "metadata": {"ttlInSeconds": "60"}}])
        assert refusal(refused) == (400, "ERR_MALFORMED_REQUEST", None)
        assert refused.json()["message"].startswith(f"{field}: "), refused.json()
    too_long = await save(dapr, scope, {"key": "a", "value": 1,
                                        "metadata": {"ttlInSeconds": "315360001"}})
    assert refusal(too_long) == (400, "ERR_MALFORMED_REQUEST", None)
    assert "$[0].metadata.ttlInSeconds: a whole number of seconds, at most 315360000" \
        in too_long.json()["message"]


async def test_a_transactions_refusals_name_its_operations(dapr: httpx.AsyncClient,
                                                            scope: str) -> None:
    def tx(*operations: tuple[str, dict[str, Any]]) -> dict[str, Any]:
        return {"operations": [{"operation": op, "request": r} for op, r in operations]}

    await save(dapr, scope, {"key": "kept", "value": 1})
    big = await dapr.post(f"/{scope}/transaction", json=tx(
        ("delete", {"key": "gone"}), ("upsert", {"key": "a", "value": 1}),
        ("upsert", {"key": "b", "value": BIG_VALUE})))
    assert refusal(big) == (413, "ERR_STATE_TRANSACTION", "VALUE_TOO_LARGE")
    assert named(big)[1] == "$.operations[2].request.value"
    long_key = await dapr.post(f"/{scope}/transaction", json=tx(
        ("upsert", {"key": "a", "value": 1}), ("delete", {"key": LONG_KEY})))
    assert refusal(long_key) == (400, "ERR_STATE_TRANSACTION", "KEY_TOO_LONG")
    assert named(long_key)[1] == "$.operations[1].request.key"
    stale = await dapr.post(f"/{scope}/transaction", json=tx(
        ("upsert", {"key": "new", "value": 1}), ("delete", {"key": "kept", "etag": "9"})))
    assert refusal(stale) == (409, "ERR_STATE_TRANSACTION", "CONFLICT")
    assert named(stale)[1] == "$.operations[1].request"
    chained = await dapr.post(f"/{scope}/transaction", json=tx(
        ("upsert", {"key": "kept", "value": 2}), ("upsert", {"key": "x", "value": 1}),
        ("upsert", {"key": "kept", "value": 3, "etag": "1"})))
    assert refusal(chained)[:2] == (409, "ERR_STATE_TRANSACTION")
    assert chained.json()["message"].startswith(
        "$.operations[2].request.etag: possible etag mismatch"), chained.json()
    assert (await dapr.get(f"/{scope}/kept")).json() == 1  # nothing written


async def test_reads_name_the_key_the_caller_sent(dapr: httpx.AsyncClient, scope: str) -> None:
    got = await dapr.get(f"/{scope}/{LONG_KEY}")
    assert refusal(got) == (400, "ERR_STATE_GET", "KEY_TOO_LONG")
    assert named(got)[1] == "key"
    deleted = await dapr.delete(f"/{scope}/{LONG_KEY}")
    assert refusal(deleted) == (400, "ERR_STATE_DELETE", "KEY_TOO_LONG")
    assert named(deleted)[1] == "key"
    # a key asked twice is read once: the native index (1) is not the caller's (2)
    bulk = await dapr.post(f"/{scope}/bulk", json={"keys": ["a", "a", LONG_KEY]})
    assert refusal(bulk) == (400, "ERR_STATE_BULK_GET", "KEY_TOO_LONG")
    message, path = named(bulk)
    assert path == "$.keys[2]" and ": $.keys[2] is 1025 bytes" in message, message
    # in a store spanning scopes a key's app is its scope: a scope too long names the key
    spread = await save(dapr, "spread", {"key": f"{LONG_KEY}||k", "value": 1})
    assert refusal(spread)[:2] == (400, "ERR_STATE_SAVE")
    message, path = named(spread)  # (the scope's size said: the key's is not what is over)
    assert path == "$[0].key" and "spread: $[0].key: scope is " in message, message


async def test_a_querys_refusal_names_its_filter(dapr: httpx.AsyncClient, scope: str) -> None:
    query = str(dapr.base_url).rstrip("/").replace("/v1.0/", "/v1.0-alpha1/") + f"/{scope}/query"
    refused = await dapr.post(query, json={"filter": {"AND": [
        {"EQ": {"state": "CA"}}, {"IN": {"person.org": list(range(101))}}]}})
    assert refusal(refused) == (400, "ERR_STATE_QUERY", "INVALID_REQUEST")
    message, path = named(refused)
    assert path == '$.filter.AND[1].IN["person.org"]' and path in message, message
