"""The HTTP face's text headers are the bus's fields (docs/http.md): `Idempotency-Key` the
entry's `id`, `X-Stateworker-Context` its `context`. From a caller's side: text beyond ASCII,
sent as UTF-8 (as curl and the SDKs send it), names on HTTP what it names on the bus. Read as
Starlette reads a header (latin-1) and encoded again, `société` was `sociÃ©tÃ©`: KeeperHub's
org of a write over HTTP was another org than the same context's over the bus (its value
unreachable there, and over HTTP from a context that escapes the same text), and an
`Idempotency-Key` was another call id than the same id over the bus. Bytes that are not UTF-8
are refused naming the header, as the bus refuses them in its fields; nothing is run."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from tests.integration.busproto import roundtrip
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

CONTEXT = {"org_id": "société", "workflow_id": "wf-é"}
ISOLATED = {"isolation": "workflow", "key": "cursor"}


async def call(http: httpx.AsyncClient, fn: str, body: object, **headers: bytes
               ) -> httpx.Response:
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return await http.post(f"/v1/call/{fn}", content=msgspec.json.encode(body), headers=named)


async def test_a_context_beyond_ascii_names_on_http_what_it_names_on_the_bus(
        served: tuple[StateService, httpx.AsyncClient], redis_server: RedisServer,
        prefix: str) -> None:
    _, http = served
    as_sent = json.dumps(CONTEXT, ensure_ascii=False).encode()  # UTF-8 bytes in the header
    written = await call(http, "state::set", {**ISOLATED, "value": 4219},
                         x_stateworker_context=as_sent)
    assert written.status_code == 200, written.text
    raw = aredis.Redis(port=redis_server.port)
    try:  # the same context over the bus reads the same scope
        read = await roundtrip(raw, prefix, "state::get", ISOLATED,
                               context=json.dumps(CONTEXT, ensure_ascii=False))
        assert read["ok"] and read["result"] == 4219, read
        groups = await roundtrip(raw, prefix, "state::list_groups", {})
        assert groups["result"]["groups"] == ["wf/société/wf-é"], groups
    finally:
        await raw.aclose()
    # and over HTTP, the same context written with escapes (ASCII) reads it too
    escaped = await call(http, "state::get", ISOLATED,
                         x_stateworker_context=json.dumps(CONTEXT).encode())
    assert escaped.json()["result"] == 4219, escaped.text


async def test_an_idempotency_key_beyond_ascii_is_the_bus_calls_id(
        served: tuple[StateService, httpx.AsyncClient], redis_server: RedisServer,
        prefix: str, scope: str) -> None:
    _, http = served
    body = {"scope": scope, "key": "paid", "ops": [{"type": "increment", "path": "n", "by": 1}]}
    first = await call(http, "state::update", body, idempotency_key="pay-é".encode())
    assert first.status_code == 200 and first.json()["id"] == "pay-é", first.text
    raw = aredis.Redis(port=redis_server.port)
    try:  # the bus's retry of the same id gets the recorded reply, applied once
        retry = await roundtrip(raw, prefix, "state::update", body, call_id="pay-é")
        assert retry["ok"] and retry["result"] == first.json()["result"], retry
        other = await roundtrip(raw, prefix, "state::update", {**body, "key": "other"},
                                call_id="pay-é")
        assert other["error"]["code"] == "CALL_ID_REUSED", other
    finally:
        await raw.aclose()
    now = await call(http, "state::get", {"scope": scope, "key": "paid"})
    assert now.json()["result"] == {"n": 1}, now.text


async def test_header_bytes_that_are_not_utf8_are_refused_naming_the_header(
        served: tuple[StateService, httpx.AsyncClient], scope: str) -> None:
    _, http = served
    write = {"scope": scope, "key": "k", "value": 1}
    for header, sent in (("Idempotency-Key", {"idempotency_key": b"caf\xe9"}),
                         ("X-Stateworker-Context",
                          {"x_stateworker_context": b'{"org_id":"soci\xe9t\xe9"}'})):
        refused = await call(http, "state::set", write, **sent)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "INVALID_REQUEST" and error["details"]["path"] == header, error
        assert "UTF-8" in error["message"], error
    nothing = await call(http, "state::get", {"scope": scope, "key": "k"})
    assert nothing.json()["result"] is None, nothing.text
