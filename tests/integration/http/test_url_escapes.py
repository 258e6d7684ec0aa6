"""A URL's %-escapes that decode to bytes that are no UTF-8 (`%FF`, `%FE`, `%C0%AF`), sent by a
caller at each door of the HTTP face (the call API's path, the console's query parameters,
Dapr's path and `metadata.*`). The server would read each such byte as U+FFFD: the name from
the URL would be another than the caller sent, another caller's (the one named U+FFFD), and
many byte strings one name. Each door refuses the request, 400 and INVALID_REQUEST naming
the path or the parameter, in its own error shape; a name whose escapes are UTF-8 reaches
exactly its own entry."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_from_bytes

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker.app.service import StateService
from tests.integration.http.conftest import post

pytestmark = pytest.mark.anyio

THEIRS = "\ufffd"  # the name each byte that is no UTF-8 would have become


async def theirs_written(http: httpx.AsyncClient) -> None:
    """Another caller's entries named U+FFFD: a scope and key of their own, and a Dapr key."""
    status, answer = await post(http, "state::set",
                                {"scope": THEIRS, "key": THEIRS, "value": "theirs"})
    assert status == 200, answer
    saved = await http.post("/v1.0/state/statestore",
                            content=msgspec.json.encode([{"key": THEIRS, "value": "theirs"}]))
    assert saved.status_code == 204, saved.text


def call_api_refusal(response: httpx.Response, path: str) -> str:
    """The call API's error document of a URL refused, naming `path`; its message."""
    assert response.status_code == 400, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    document = msgspec.json.decode(response.content)
    assert document["ok"] is False and document["id"] is None, document
    error = document["error"]
    assert (error["code"], error["details"]) == ("INVALID_REQUEST", {"path": path}), error
    assert "must decode to UTF-8" in error["message"], error
    message: str = error["message"]
    return message


def dapr_refusal(response: httpx.Response, path: str) -> str:
    """Dapr's error body of a URL refused, its ErrorInfo naming our code and `path`."""
    assert response.status_code == 400, (response.status_code, response.text)
    error = msgspec.json.decode(response.content)
    assert error["errorCode"] == "ERR_MALFORMED_REQUEST", error
    assert "must decode to UTF-8" in error["message"], error
    (info,) = error["details"]
    assert (info["reason"], info["metadata"]) == ("INVALID_REQUEST", {"path": path}), error
    message: str = error["message"]
    return message


async def test_a_function_name_whose_escapes_are_no_utf8_is_refused(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    _, http = served
    await theirs_written(http)
    body = msgspec.json.encode({"scope": THEIRS, "key": THEIRS})
    for path in ("/v1/call/%FF", "/v1/call/state::get%FE", "/v1/call/state%C0%AF::get"):
        message = call_api_refusal(await http.post(path, content=body), "path")
        assert message.startswith("path: its %-escapes must decode to UTF-8 text, and byte 9 "
                                  if path == "/v1/call/%FF" else "path: "), message
    # escapes that are UTF-8 name the function they spell
    status, answer = await post(http, "state%3A%3Aget", {"scope": THEIRS, "key": THEIRS})
    assert (status, answer["result"]) == (200, "theirs"), answer


async def test_console_parameters_whose_escapes_are_no_utf8_are_refused(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    """`?scope=%FF` read the history of the scope U+FFFD, and counted its keys."""
    _, http = served
    await theirs_written(http)
    call_api_refusal(await http.get("/v1/console/history?scope=%FF&key=%FE"), "scope")
    call_api_refusal(await http.get(f"/v1/console/history?scope={quote_from_bytes(THEIRS.encode())}"
                                    "&key=%C0%AF"), "key")
    call_api_refusal(await http.get("/v1/console/counts?scope=mine&scope=%FE"), "scope")
    call_api_refusal(await http.get("/v1/console/counts?sc%FFope=mine"), "query")
    async with http.stream("GET", "/v1/console/tail?scope=mine&prefix=a%FF") as tail:
        await tail.aread()
        call_api_refusal(tail, "prefix")
    # the owner, sending the name's own escapes, still reads it
    named = quote_from_bytes(THEIRS.encode())
    history = await http.get(f"/v1/console/history?scope={named}&key={named}")
    assert history.status_code == 200, history.text
    assert [(e["scope"], e["key"], e["new_value"]) for e in history.json()["events"]] == [
        (THEIRS, THEIRS, "theirs")]


async def test_dapr_paths_and_metadata_whose_escapes_are_no_utf8_are_refused(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    """`DELETE /v1.0/state/statestore/%FE` deleted the key U+FFFD, another caller's."""
    _, http = served
    await theirs_written(http)
    for method, path in (("DELETE", "/v1.0/state/statestore/%FE"),
                         ("GET", "/v1.0/state/statestore/%FF"),
                         ("GET", "/v1.0/state/statestore/a/%C0%AF"),
                         ("POST", "/v1.0/state/st%FFore/bulk")):
        message = dapr_refusal(await http.request(method, path, content=b'{"keys":[]}'), "path")
        assert message.startswith("the request: path: its %-escapes must decode to UTF-8"), message
    saved = msgspec.json.encode([{"key": "mine", "value": 1}])
    dapr_refusal(await http.post("/v1.0/state/statestore?metadata.contentType=%FF",
                                 content=saved), "metadata.contentType")
    dapr_refusal(await http.post("/v1.0/state/statestore/transaction?metadata.x=1&metadata.y=%FE",
                                 content=b'{"operations":[]}'), "metadata.y")
    assert (await http.get("/v1.0/state/statestore/mine")).status_code == 204  # nothing saved
    kept = await http.get("/v1.0/state/statestore/%EF%BF%BD")
    assert (kept.status_code, kept.json()) == (200, "theirs")


name_bytes = st.one_of(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).map(str.encode),
    st.binary(min_size=1, max_size=12))


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(raw=name_bytes)
async def test_a_name_reaches_exactly_its_entry_or_is_refused(
        served: tuple[StateService, httpx.AsyncClient], raw: bytes) -> None:
    """Any bytes %-escaped as a Dapr key, a console `key` and a function name: UTF-8 text
    reaches the entry (or function) of exactly that name; anything else is refused."""
    _, http = served
    escaped = quote_from_bytes(raw, safe="")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        dapr_refusal(await http.get(f"/v1.0/state/statestore/{escaped}"), "path")
        call_api_refusal(await http.get(f"/v1/console/history?scope=statestore&key={escaped}"),
                         "key")
        call_api_refusal(await http.post(f"/v1/call/{escaped}", content=b"{}"), "path")
        return
    saved = await http.post("/v1.0/state/statestore",
                            content=msgspec.json.encode([{"key": text, "value": text}]))
    assert saved.status_code == 204, saved.text
    got = await http.get(f"/v1.0/state/statestore/{escaped}")
    assert (got.status_code, got.json()) == (200, text)
    history = await http.get(f"/v1/console/history?scope=statestore&key={escaped}")
    assert history.status_code == 200, history.text
    events: list[dict[str, Any]] = history.json()["events"]
    assert events and {e["key"] for e in events} == {text}, events
    called = await http.post(f"/v1/call/{escaped}", content=b"{}")
    error = called.json()["error"]
    assert (called.status_code, error["code"], error["details"]["fn"]) == (
        404, "UNKNOWN_FUNCTION", text), error
