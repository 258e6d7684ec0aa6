"""The HTTP face (`serve --http`, app/http.py) with a real HTTP client: every function of the
catalog through `POST /v1/call/<function>` answers as over the bus, errors carry their
code's HTTP status, an Idempotency-Key is a call id, `/metrics` parses with the Prometheus
client's own parser and moves with calls, `/healthz` and `/readyz` tell a dead Redis."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import StateError
from stateworker.settings import Settings
from tests.calls import calls
from tests.integration.http.conftest import http_settings, post, samples, serving
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


# What differs between two runs of the same calls: times, stream ids, generated ids.
VOLATILE_KEYS = {"tx"}  # a transaction's generated id
VOLATILE_TEXT = re.compile(r"^(\d{13}-\d+|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d.*)$")  # id, time


# The calls list writes `short` with a 1 ms expiry: what these count depends on whether the
# reaper has deleted it yet (an index's members, a prefix's deletes), in either run.
RACING_THE_REAPER = {"state::list-indexes", "state::delete-by-prefix"}


def steady(value: Any) -> Any:
    """`value` with what differs between runs masked."""
    if isinstance(value, dict):
        return {k: "*" if k in VOLATILE_KEYS else steady(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [steady(v) for v in value]
    if isinstance(value, str) and VOLATILE_TEXT.match(value):
        return "*"
    if isinstance(value, int) and not isinstance(value, bool) and value > 10**12:
        return "*"  # an epoch ms
    return value


async def test_every_function_over_http_answers_as_over_the_bus(
        redis_server: RedisServer, prefix: str) -> None:
    """The catalog's calls, in order, on two prefixes: one over the bus, one over HTTP."""
    bus_settings = Settings(redis_url=redis_server.url, prefix=f"{prefix}b", partitions=4)
    over_bus: list[Any] = []
    async with StateService.running(bus_settings, BusOptions(block_ms=50)), \
            StateClient(settings=bus_settings, timeout=30) as client:
        for fn, body, context in calls(bus_settings.prefix):
            try:
                result = await client.call_json(fn, msgspec.json.encode(body), context=context)
                over_bus.append((fn, "OK", msgspec.json.decode(result)))
            except StateError as exc:
                over_bus.append((fn, exc.code, exc.message))
    http_prefix = f"{prefix}h"
    over_http: list[Any] = []
    async with StateService.running(http_settings(redis_server.url, http_prefix),
                                    BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        for fn, body, context in calls(http_prefix):
            headers = {} if context is None else {
                "X-Stateworker-Context": msgspec.json.encode(context).decode()}
            status, document = await post(http, fn, body, **headers)
            if document["ok"]:
                assert status == 200
                over_http.append((fn, "OK", document["result"]))
            else:
                over_http.append((fn, document["error"]["code"], document["error"]["message"]))
    assert len(over_http) == len(over_bus) > 40
    for bus, http in zip(over_bus, over_http, strict=True):
        if bus[0] in RACING_THE_REAPER:  # (whether the reaper took `short` yet: its count)
            assert http[:2] == bus[:2]
        else:
            assert steady(http) == steady(bus)


async def test_errors_carry_their_codes_status(
        served: tuple[StateService, httpx.AsyncClient], scope: str) -> None:
    service, http = served
    k = {"scope": scope, "key": "k"}
    status, document = await post(http, "state::set", {**k, "value": 1})
    assert (status, document["result"]["version"], document["id"]) == (200, 1, None)
    status, document = await post(http, "state::set", {**k, "value": 2, "expected_version": 7})
    assert (status, document["error"]["code"]) == (409, "CONFLICT")
    status, document = await post(http, "state::nope", {})
    assert (status, document["error"]["code"]) == (404, "UNKNOWN_FUNCTION")
    status, document = await post(http, "state::set", b'{"scope": ')
    assert (status, document["error"]["code"]) == (400, "INVALID_REQUEST")
    status, document = await post(http, "state::set", {**k, "value": 1, "ttl_ms": -1})
    assert (status, document["error"]["details"]["path"]) == (400, "$.ttl_ms")
    too_big = b'{"scope":"s","key":"k","value":"' + b"x" * service.runtime.options.max_body_bytes
    status, document = await post(http, "state::set", too_big + b'"}')
    assert (status, document["error"]["code"]) == (413, "VALUE_TOO_LARGE")
    status, document = await post(http, "state::get", k, **{"X-Stateworker-Context": "[1]"})
    assert (status, document["error"]["details"]["path"]) == (400, "X-Stateworker-Context")
    deep = '{"a":' * 2000 + "1" + "}" * 2000
    status, document = await post(http, "state::get", k, **{"X-Stateworker-Context": deep})
    assert (status, document["error"]["code"]) == (400, "INVALID_REQUEST")

    response = await http.get("/v1/call/state::get")
    assert response.status_code == 405


async def test_a_path_or_method_the_face_does_not_serve_is_an_error_document(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    """As every refusal: JSON with a code and a message naming the path (and the methods it
    takes, in `Allow` too), not plain text a client must special-case."""
    _, http = served
    for method, path, status, allowed in (
            ("PUT", "/v1/call/state::get", 405, "POST"), ("DELETE", "/v1/console/tail", 405,
                                                          "GET, HEAD"),
            ("PATCH", "/v1.0/state/statestore", 405, None), ("GET", "/nope", 404, None)):
        answer = await http.request(method, path)
        assert answer.status_code == status and answer.headers["content-type"] == \
            "application/json", (method, path, answer.text)
        error = answer.json()["error"]
        assert (error["code"], error["details"]["path"]) == ("INVALID_REQUEST", path), error
        assert path in error["message"], error
        if allowed is not None:  # (in any order)
            assert sorted(answer.headers["allow"].split(", ")) == sorted(allowed.split(", "))
            assert sorted(error["details"]["allowed"]) == sorted(allowed.split(", ")), error


async def test_an_idempotency_key_is_a_call_id(
        served: tuple[StateService, httpx.AsyncClient], scope: str) -> None:
    _, http = served
    body = {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "n", "by": 1}]}
    status, first = await post(http, "state::update", body, **{"Idempotency-Key": "inc-1"})
    assert status == 200 and first["id"] == "inc-1" and first["result"]["new_value"] == {"n": 1}
    _, again = await post(http, "state::update", body, **{"Idempotency-Key": "inc-1"})
    assert again == first  # applied once: the recorded reply
    status, other = await post(http, "state::update", {**body, "key": "m"},
                               **{"Idempotency-Key": "inc-1"})
    assert (status, other["error"]["code"]) == (409, "CALL_ID_REUSED")
    _, read = await post(http, "state::get", {"scope": scope, "key": "n"})
    assert read["result"] == {"n": 1}


async def test_health_and_readiness_tell_a_dead_redis(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        async with StateService.running(http_settings(server.url, prefix),
                                        BusOptions(block_ms=50)) as service, \
                httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
            assert (await http.get("/healthz")).status_code == 200
            ready = await http.get("/readyz")
            assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
            server.kill()
            unready = await http.get("/readyz")
            assert unready.status_code == 503 and server.url.split("//")[1] in unready.json()[
                "reason"]
            assert (await http.get("/healthz")).status_code == 200
            metrics = samples((await http.get("/metrics")).text)
            assert metrics[("stateworker_redis_up", ())] == 0
            status, document = await post(http, "state::get", {"scope": "s", "key": "k"})
            assert (status, document["error"]["code"]) == (503, "UNAVAILABLE")
    finally:
        server.kill()


async def test_calls_in_flight_run_together_and_each_gets_its_own_result(
        served: tuple[StateService, httpx.AsyncClient], scope: str) -> None:
    """64 requests at once: one pipeline for many of them (app/batches.py), and still each
    its own reply: 64 increments of one counter answer 1..64, once each."""
    service, http = served
    sizes: list[int] = []
    execute_many = service.state.execute_many

    async def spied(plans: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(plans))
        return await execute_many(plans, *args, **kwargs)

    service.state.execute_many = spied  # type: ignore[method-assign]
    body = {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "n", "by": 1}]}
    seen: list[int] = []

    async def one() -> None:
        status, document = await post(http, "state::update", body)
        assert status == 200, document
        seen.append(document["result"]["new_value"]["n"])

    async with anyio.create_task_group() as tg:
        for _ in range(64):
            tg.start_soon(one)
    assert sorted(seen) == list(range(1, 65))
    assert max(sizes) > 1, sizes  # (the reaper and others run plans of their own too)


async def test_a_page_of_another_site_may_not_call(served: tuple[StateService, httpx.AsyncClient],
                                                   scope: str) -> None:
    service, http = served
    body = msgspec.json.encode({"scope": scope, "key": "k", "value": 1})
    host, port = service.http_address.rsplit(":", 1)
    # (a malformed one too: `http://[::1` is no URL, and was a 500 and a dropped connection)
    for origin in ("http://evil.example", "null", f"http://{host}:{int(port) + 1}",
                   "http://[::1", f"http://[{host}:{port}"):
        refused = await http.post("/v1/call/state::set", content=body,
                                  headers={"Origin": origin, "Content-Type": "text/plain"})
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "PERMISSION_DENIED")
        assert "Origin" in refused.json()["error"]["message"]
    for origin in ("http://evil.example", "http://[::1"):
        dapr = await http.post(f"/v1.0/state/{scope}", content=b'[{"key":"d","value":1}]',
                               headers={"Origin": origin})
        assert dapr.status_code == 403 and dapr.json()["error"]["code"] == "PERMISSION_DENIED"
    got = await http.post("/v1/call/state::get-many", content=msgspec.json.encode(
        {"scope": scope, "keys": ["k", "d"]}))
    assert [e["found"] for e in got.json()["result"]["entries"]] == [False, False]
    # The service's own pages (their Origin is its address) and programs (none) may.
    own = await http.post("/v1/call/state::set", content=body,
                          headers={"Origin": f"http://{service.http_address}"})
    assert own.json()["ok"] is True
    assert (await http.get("/healthz", headers={"Origin": "http://evil.example"})).status_code == 200


async def test_a_writer_name_over_the_limit_is_refused_at_every_door(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    """`context.execution_id` is recorded as the writer of the entry and of its every event
    (`updated_by`): the HTTP face holds it to the bus's limit, naming its header."""
    _, http = served
    context = msgspec.json.encode({"execution_id": "x" * 257}).decode()
    status, doc = await post(http, "state::set", {"scope": "o", "key": "k", "value": 1},
                             **{"X-Stateworker-Context": context})
    assert status == 400 and doc["error"]["code"] == "INVALID_REQUEST"
    assert doc["error"]["details"] == {"path": "X-Stateworker-Context.execution_id",
                                       "size": 257, "limit": 256}
    status, doc = await post(http, "state::get", {"scope": "o", "key": "k"})
    assert status == 200 and doc["result"] is None  # (nothing written)
    context = msgspec.json.encode({"execution_id": "x" * 256}).decode()
    status, doc = await post(http, "state::set", {"scope": "o", "key": "k", "value": 1},
                             **{"X-Stateworker-Context": context})
    assert status == 200 and doc["ok"], doc


async def test_a_service_cancelled_leaves_nothing_listening(redis_server: RedisServer,
                                                           prefix: str) -> None:
    """A service cancelled soon after its start (its task group cancelled, as a supervisor
    does) never reached the HTTP server's shutdown, which alone closed the listening socket:
    the port went on accepting connections that nobody answered (and the socket was left
    to the garbage collector: the suite's stray "unclosed socket" warnings)."""
    address = ""
    with anyio.CancelScope() as scope:
        async with serving(http_settings(redis_server.url, prefix)) as (service, _):
            address = service.http_address or ""
            scope.cancel()
            await anyio.sleep_forever()  # (cancelled at once)
    host, port = address.rsplit(":", 1)
    with pytest.raises(OSError):
        stream = await anyio.connect_tcp(host, int(port))
        await stream.aclose()
