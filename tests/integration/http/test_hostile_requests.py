"""Requests a broken or hostile client sends to the HTTP face, drawn by hypothesis (a fixed,
bounded number of examples, against one live service): odd paths, bodies, headers and
metadata. Each is answered (never a 500, never a crash logged), and the service goes on
answering a normal call."""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker.app.service import StateService

pytestmark = pytest.mark.anyio

NUMBERS = [b"1e309", b"-0", b"18446744073709551616", b"-9223372036854775809", b"1.5", b"0",
           b"-1", b"9" * 5000, b"NaN", b'"1"', b"null", b"true", b"[]", b"{}"]
segment = st.one_of(
    st.sampled_from(["statestore", "state::get", "state::set", "state::update", "state::query",
                     "state::barrier", "", "%00", "%FF", "%2F", "..", "a%20b", "state::%FF",
                     "x" * 3000, "%C0%AF", "state::get%00"]),
    st.text(max_size=20).map(lambda text: quote(text, safe="")))
number = st.sampled_from(NUMBERS)
value = st.one_of(number, st.sampled_from([
    b'"workflow"', b'"k"', b'[{"type":"set","path":"a","value":1e309}]', b'["k"]',
    b'[{"pointer":"/a","op":"eq","value":1e309}]',b'"s"', b'{"a":' * 600 + b"1" + b"}" * 600,
                                           b"[" * 600 + b"]" * 600, b'"\\ud800"', b'"\xff"']))


@st.composite
def json_body(draw: st.DrawFn) -> bytes:
    """A body near what a function takes: known fields holding odd values."""
    fields = draw(st.lists(st.sampled_from(
        ["scope", "scope", "key", "key", "value", "value", "keys", "items",
         "expected_version", "ttl_ms", "keys", "limit", "etag",
         "operations", "metadata", "options", "ttlInSeconds", "filter", "sort", "page",
         "operation", "request", "concurrency", "consistency", "isolation", "ops", "where",
         "pointer", "prefix", "after", "topic", "id", "config", "function_id", "service"]), max_size=5))
    parts = [b'"' + name.encode() + b'":' + draw(value) for name in fields]
    return b"{" + b",".join(parts) + b"}"


raw_body = st.one_of(
    json_body(), st.binary(max_size=200),
    st.sampled_from([b"", b"null", b"[", b'[{"key":"k","value":1e309}]', b"\xff\xfe",
                     b'[{"key":"","value":1}]', b'[{"key":1,"value":1}]', b'[null]',
                     b'{"operations":[{"operation":"upsert","request":{"key":"k","value":1e309,'
                     b'"etag":"-1"}}]}', b'{"operations":[{"operation":"nope"}]}',
                     b'{"operations":null}', b'{"filter":{"EQ":{"a":1e309}}}',
                     b'{"filter":{"AND":' + b"[{\"AND\":" * 300 + b"[]" + b"}]" * 300 + b"}}",
                     b'{"keys":[' + b'"k",' * 2000 + b'"k"]}']))
header_value = st.sampled_from(['{"org_id":"o","workflow_id":"w"}', '{"org_id":1e309}', "",
                                "x" * 9000, "\xe9\xff", "null", "{", "[]", '{"execution_id":1}',
                                '{"traceparent":"zz"}', "-1", "1e309", "W/\"1\"", "*"])


FUNCTIONS = ["state::get", "state::set", "state::update", "state::delete", "state::query",
             "state::get-many", "state::set-many", "state::barrier", "state::list-keys"]
ROUTES = [("POST", "/v1/call/{fn}")] * 6 + [
    ("POST", "/v1.0/state/{store}"), ("GET", "/v1.0/state/{store}/{key}"),
    ("DELETE", "/v1.0/state/{store}/{key}"), ("POST", "/v1.0/state/{store}/bulk"),
    ("POST", "/v1.0/state/{store}/transaction"), ("POST", "/v1.0-alpha1/state/{store}/query"),
    ("PUT", "/v1.0/state/{store}"), ("PATCH", "/v1/call/{fn}"), ("GET", "/v1/call/{key}")]


@st.composite
def request(draw: st.DrawFn) -> tuple[str, str, bytes, dict[str, str]]:
    """Mostly a route the face serves, with its parts (names, body, headers) made odd."""
    method, template = draw(st.sampled_from(ROUTES))
    odd = draw(st.booleans())
    path = template.format(fn=draw(segment) if odd else draw(st.sampled_from(FUNCTIONS)),
                           store=draw(segment) if odd else "statestore", key=draw(segment))
    query = draw(st.sampled_from(["", "", "?metadata.ttlInSeconds=1e309",
                                  "?metadata.ttlInSeconds=-0", "?metadata.ttlInSeconds=%FF",
                                  "?metadata.ttlInSeconds=99999999999999999999",
                                  "?metadata.contentType=x&metadata.contentType=y",
                                  "?metadata.partitionKey=" + "p" * 5000]))
    names = draw(st.lists(st.sampled_from(
        ["idempotency-key", "x-stateworker-context", "if-match", "content-type",
         "dapr-api-token", "authorization"]), max_size=3, unique=True))
    headers = {name: draw(header_value) for name in names}
    return method, path + query, draw(raw_body), headers


@settings(max_examples=250, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=request())
async def test_hostile_requests_get_an_answer_and_the_face_serves_on(
        served: tuple[StateService, httpx.AsyncClient], caplog: pytest.LogCaptureFixture,
        drawn: tuple[str, str, bytes, dict[str, str]]) -> None:
    _, http = served
    caplog.set_level(logging.ERROR)
    caplog.clear()
    method, path, body, headers = drawn
    response = await http.request(method, path, content=body, headers={
        name: text.encode("latin-1") for name, text in headers.items()})
    assert response.status_code < 500 or response.status_code == 503, (response, response.text)
    if response.content and response.headers.get("content-type") == "application/json":
        json.loads(response.content)  # (json: a stored 1e309 comes back as written)
    crashes = [(r.getMessage(), getattr(r, "event", ""), r.exc_text) for r in caplog.records]
    assert not crashes, (drawn, crashes)
    normal = await http.post("/v1/call/state::set",
                             content=b'{"scope":"fuzz","key":"k","value":1}')
    assert normal.status_code == 200, normal.text
    answer: dict[str, Any] = msgspec.json.decode(normal.content)
    assert answer["ok"] is True, answer

