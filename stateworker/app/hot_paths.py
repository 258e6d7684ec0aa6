"""`HotPaths`: the HTTP face's most frequent requests sent to their endpoint directly, past
Starlette's router and its exception layer.

`POST /v1/call/<function>`, Dapr's get (`GET /v1.0/state/<store>/<key>`) and save (`POST` or
`PUT /v1.0/state/<store>`) are nearly all of a busy face's traffic. Starlette's router tries
its routes in order (the console's and Dapr's come first) and wraps each endpoint in layers of
its own: a quarter of the face's CPU per call (docs/decisions/0057). The endpoints are the
routes' own (looked up in the route table, so there is one of each), run as Starlette runs
them (a `Request`, the `Response` it returns sent), inside the same middleware: the guards
(Host, Origin) have run before, and an exception reaches Starlette's error middleware as from
the router. Any other request goes on to the router unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]

CALL = "/v1/call/"
DAPR_STATE = "/v1.0/state/"


class HotPaths:
    """ASGI middleware (module docstring)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.call = _endpoint(routes, CALL + "{function:path}", "POST")
        self.get = _endpoint(routes, DAPR_STATE + "{store}/{key:path}", "GET")
        self.save = _endpoint(routes, DAPR_STATE + "{store}", "POST")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            hot = self._match(scope["method"], scope["path"])
            if hot is not None:
                endpoint, scope["path_params"] = hot
                response = await endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _match(self, method: str, path: str) -> tuple[Endpoint, dict[str, Any]] | None:
        """The endpoint and path parameters Starlette's router would give, for a hot path
        (the same patterns: `{store}` one segment, not empty; `{key:path}` the rest)."""
        if method == "POST" and path.startswith(CALL):
            return self.call, {"function": path[len(CALL):]}
        if path.startswith(DAPR_STATE):
            store, slash, key = path[len(DAPR_STATE):].partition("/")
            if not store:
                return None
            if method == "GET" and slash:
                return self.get, {"store": store, "key": key}
            if method in ("POST", "PUT") and not slash:
                return self.save, {"store": store}
        return None


def _endpoint(routes: Sequence[BaseRoute], path: str, method: str) -> Endpoint:
    """The endpoint of the route of `path` that takes `method`."""
    for route in routes:
        if isinstance(route, Route) and route.path == path and method in (route.methods or ()):
            return route.endpoint
    raise LookupError(f"no route {method} {path}")
