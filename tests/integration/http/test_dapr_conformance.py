"""What Dapr's runtime (its HTTP API, pkg/api/http) answers at the edges of a request, whatever
the state store behind it, answered the same here: options given as `""` (not given), a key
holding Dapr's key separator `||` (refused on every path of a store of one scope), the `consistency` and
`concurrency` of a get's or a delete's URL (checked, as a save's options are), and a bulk get
or a transaction whose body leaves out its list (none asked)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.integration.http.conftest import refusal, save

pytestmark = pytest.mark.anyio


async def test_options_given_as_empty_text_are_not_given(dapr: httpx.AsyncClient,
                                                         scope: str) -> None:
    """Dapr's stores take `""` as no concurrency or consistency (components-contrib's
    validateConcurrencyOption: `c != "" && ...`), as serializers that write every field send."""
    empty = {"concurrency": "", "consistency": ""}
    saved = await save(dapr, scope, {"key": "k", "value": 1, "options": empty})
    assert saved.status_code == 204, saved.text
    again = await save(dapr, scope, {"key": "k", "value": 2, "options": empty})
    assert again.status_code == 204, again.text  # (last-write: not create-only)
    done = await dapr.post(f"/{scope}/transaction", json={"operations": [
        {"operation": "upsert", "request": {"key": "k", "value": 3, "options": empty}},
        {"operation": "delete", "request": {"key": "j", "options": empty}}]})
    assert done.status_code == 204, done.text
    assert (await dapr.get(f"/{scope}/k")).json() == 3
    bogus = await save(dapr, scope, {"key": "k", "value": 4, "options": {"concurrency": "x"}})
    assert refusal(bogus) == (400, "ERR_MALFORMED_REQUEST", None)


@pytest.mark.parametrize("key", ["a||b", "||", "a||", "||b"])
async def test_a_key_holding_daprs_separator_is_refused_on_every_path(
        dapr: httpx.AsyncClient, scope: str, key: str) -> None:
    """Dapr's runtime refuses a key with `||` (its key scheme's separator, `<app>||<key>`)
    before any store sees it: 400 ERR_MALFORMED_REQUEST on a get, a save, a delete, a bulk get
    and a transaction. Taken, a program ran here that fails on Dapr."""
    answers = {
        "save": await save(dapr, scope, {"key": key, "value": 1}),
        "get": await dapr.get(f"/{scope}/{key}"),
        "delete": await dapr.delete(f"/{scope}/{key}"),
        "bulk": await dapr.post(f"/{scope}/bulk", json={"keys": ["ok", key]}),
        "transaction": await dapr.post(f"/{scope}/transaction", json={"operations": [
            {"operation": "upsert", "request": {"key": "ok", "value": 1}},
            {"operation": "delete", "request": {"key": key}}]})}
    fields = {"save": "$[0].key", "get": "key", "delete": "key", "bulk": "$.keys[1]",
              "transaction": "$.operations[1].request.key"}
    for path, answer in answers.items():
        assert refusal(answer) == (400, "ERR_MALFORMED_REQUEST", None), (path, answer.text)
        message = answer.json()["message"]
        assert message.startswith(f"{fields[path]}: ") and "'||'" in message, (path, message)
    assert (await dapr.get(f"/{scope}/ok")).status_code == 204  # the transaction: nothing


@pytest.mark.parametrize(("method", "query", "field"), [
    ("GET", "consistency=linear", "consistency"),
    ("DELETE", "consistency=linear", "consistency"),
    ("DELETE", "concurrency=first", "concurrency")])
async def test_a_get_or_delete_checks_the_options_of_its_url(
        dapr: httpx.AsyncClient, scope: str, method: str, query: str, field: str) -> None:
    """Dapr's get takes `consistency` and its delete `concurrency` and `consistency` on the URL
    and its stores refuse a value they do not know (CheckRequestOptions): the delete is not
    done. Ignored here, the delete was done."""
    await save(dapr, scope, {"key": "k", "value": 1})
    refused = await dapr.request(method, f"/{scope}/k?{query}")
    assert refusal(refused) == (400, "ERR_MALFORMED_REQUEST", None), refused.text
    assert refused.json()["message"].startswith(f"{field}: "), refused.text
    assert (await dapr.get(f"/{scope}/k")).json() == 1
    for good in ("consistency=strong&concurrency=last-write", "consistency=eventual",
                 "concurrency=first-write", "consistency=&concurrency="):
        answer = await dapr.get(f"/{scope}/k?{good}")
        assert answer.status_code == 200 and answer.json() == 1, (good, answer.text)
    assert (await dapr.delete(f"/{scope}/k?concurrency=first-write&consistency=strong")
            ).status_code == 204
    assert (await dapr.get(f"/{scope}/k")).status_code == 204


@pytest.mark.parametrize(("path", "body", "status", "answer"), [
    ("/bulk", {}, 200, []), ("/bulk", {"parallelism": 10}, 200, []),
    ("/transaction", {}, 204, None), ("/transaction", {"metadata": {"a": "b"}}, 204, None),
    ("", None, 204, None)])
async def test_a_body_without_its_list_asks_for_nothing(
        dapr: httpx.AsyncClient, scope: str, path: str, body: Any, status: int,
        answer: Any) -> None:
    """Dapr reads a bulk get without `keys`, a transaction without `operations` and a save of
    `null` as asking for none (Go's decoding leaves the list empty): `[]`, 204, 204."""
    response = await dapr.post(f"/{scope}{path}", content=json.dumps(body).encode())
    assert response.status_code == status, response.text
    if answer is not None:
        assert response.json() == answer
