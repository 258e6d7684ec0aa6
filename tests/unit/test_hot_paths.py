"""`HotPaths` (app/hot_paths.py) sends a request to the endpoint Starlette's router would
pick, with the same path parameters, or leaves it to the router; `CallDoor` answers exactly
the requests the router sends to the call API's route: for every method on paths near the
hot ones (the Dapr routes are the real table's, `dapr_routes`)."""

from __future__ import annotations

import itertools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from stateworker.app.dapr import dapr_routes
from stateworker.app.dapr_requests import dapr_stores
from stateworker.app.hot_paths import HotPaths, takes
from stateworker.settings import Settings

METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")
PATHS = ("/v1/call/state::get", "/v1/call/", "/v1/call/a/b", "/v1/call", "/v1/callx/a",
         "/v1.0/state/statestore", "/v1.0/state/statestore/", "/v1.0/state/statestore/k",
         "/v1.0/state/statestore/a/b", "/v1.0/state/statestore/bulk",
         "/v1.0/state/statestore/transaction", "/v1.0/state//k", "/v1.0/state/",
         "/v1.0/state", "/v1.0-alpha1/state/statestore/query", "/v1.0/healthz", "/healthz")


async def endpoint(_: Request) -> Response:
    return Response()


async def call(_: Request) -> Response:
    return Response()


async def unused(*_: Any) -> bytes:
    return b""


def routes() -> list[Route]:
    table = dapr_routes(unused, unused, dapr_stores(Settings()), "stateworker", "0", 1)
    return [*table, Route("/v1/call/{function:path}", call, methods=["POST"]),
            Route("/healthz", endpoint, methods=["GET"])]


def routed(table: list[Route], method: str, path: str) -> tuple[Any, dict[str, Any]] | None:
    """What Starlette's router runs for the request: the first full match's endpoint and
    path parameters (None: a partial match's 405, or a 404)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in table:
        match, child = route.matches(scope)
        if match == Match.FULL:
            return child["endpoint"], child["path_params"]
    return None


def test_a_hot_path_is_what_the_router_would_run() -> None:
    table = routes()
    hot = HotPaths(endpoint, table)
    taken = 0
    for method, path in itertools.product(METHODS, PATHS):
        mine = hot._match(method, path)
        if mine is not None:  # (None: left to the router, whatever it does)
            taken += 1
            assert mine == routed(table, method, path), (method, path)
    assert taken >= 5  # the hot ones were taken


def test_the_call_door_takes_what_the_router_sends_to_the_call_api() -> None:
    table = routes()
    taken = 0
    for method, path in itertools.product(METHODS, PATHS):
        route = routed(table, method, path)
        to_call = route is not None and route[0] is call
        assert takes(method, path) == to_call, (method, path)
        if to_call:
            taken += 1
            assert route is not None and route[1] == {"function": path[len("/v1/call/"):]}
    assert taken == 3  # ("/v1/call/state::get", "/v1/call/", "/v1/call/a/b")
