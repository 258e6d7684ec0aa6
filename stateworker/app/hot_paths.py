"""The HTTP face's most frequent requests answered past Starlette's layers.

`CallDoor`, in front of the app: `POST /v1/call/<function>`, the call API, answered there
(its guards, Host, Origin and the URL's escapes (app/url_text.py), run as their middleware
would; the reply sent as two ASGI messages, no Request or Response made), every other
request passed to the app. Starlette's
own layers (its error middleware, each middleware's frame, a Request, a Response and its
send wrapper) cost about a fifth of the service's CPU a call (docs/decisions/0057).

`HotPaths`, inside the guards' middleware: Dapr's get (`GET /v1.0/state/<store>/<key>`) and
save (`POST` or `PUT /v1.0/state/<store>`), the rest of a busy face's traffic, sent to their
endpoint past Starlette's router, which tries its routes in order (the console's first) and
wraps each endpoint in layers of its own. The endpoints are the routes' own (looked up in the
route table, so there is one of each), run as Starlette runs them (a `Request`, the
`Response` it returns sent); an exception reaches Starlette's error middleware as from the
router. Any other request goes on to the router unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from stateworker.app.hosts import host_refusal, send_refusal
from stateworker.app.logins import origin_refusal
from stateworker.app.url_text import url_refusal

Endpoint = Callable[[Request], Awaitable[Response]]
# (a function's name, the request's headers by lower-case name (the first of a repeated
# one), its receive, a Request of it made when needed) -> the reply document, the status
Answer = Callable[[str, dict[bytes, bytes], Receive, Callable[[], Request]],
                  Awaitable[tuple[bytes, int]]]

CALL = "/v1/call/"
DAPR_STATE = "/v1.0/state/"


class CallDoor:
    """ASGI app (module docstring): the call API's requests answered by `answer`, the others
    sent to `app`. The guards as HostGuard, SameOrigin and UrlText run them (the last of a
    repeated header); a call sees the first of one, as Starlette's `headers.get` gives."""

    def __init__(self, app: ASGIApp, answer: Answer, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.answer = answer
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not takes(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        last = dict(scope["headers"])
        refusal = host_refusal(self.hosts, last) or origin_refusal(last) or url_refusal(scope)
        if refusal is not None:
            await send_refusal(send, refusal)
            return
        document, status = await self.answer(
            scope["path"][len(CALL):], dict(reversed(scope["headers"])), receive,
            lambda: Request(scope, receive))
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-length", b"%d" % len(document)), _JSON]})
        await send({"type": "http.response.body", "body": document})


_JSON = (b"content-type", b"application/json")


def takes(method: str, path: str) -> bool:
    """Whether CallDoor answers a request (the router's `POST /v1/call/{function:path}`)."""
    return method == "POST" and path.startswith(CALL)


class HotPaths:
    """ASGI middleware (module docstring)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
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
