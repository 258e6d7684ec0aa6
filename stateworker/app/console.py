"""The console: a page of the HTTP face (`/console/`, its files in app/assets/, no CDN) and the
few reads it needs beyond the call API, which it uses for everything else (scopes, keys,
values, writes: `POST /v1/call/<function>` with `X-Stateworker-Console`, so its calls are the
bus's, checked by the same roles).

    GET  /console/                 the page; /console/<file> its script and style (the files
                                   of stateworker/console_files/, uicontent.py)
    GET  /v1/console/session       who the page acts as: {auth, principal, writes}
    POST /v1/console/login         {principal, password} -> a session cookie (`acl` mode)
    POST /v1/console/logout
    GET  /v1/console/overview      the front page: `stateworker status`'s report, triggers
                                   with the lag of their partitions, claimed namespaces,
                                   principals and roles (`acl` mode: an admin's only)
    GET  /v1/console/history       a key's recent events (old and new values)
    GET  /v1/console/counts        the keys of each scope named (`scope`, repeated)
    GET  /v1/console/tail          the live tail: events as server-sent events, filtered by
                                   scope, key and key prefix

In `acl` mode every route but the page, its files and the login needs a principal (the
session, or Basic credentials: app/logins.py); the history and the tail need a read grant on
the scope (on `*` without one), as `state::get` does; a count is given for the scopes the
principal may read. app/console_reads.py reads what these show.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from stateworker.app import console_reads
from stateworker.app.bodies import read_body
from stateworker.app.console_reads import Rates
from stateworker.app.hosts import local_only
from stateworker.app.logins import COOKIE, SESSION_S, Logins
from stateworker.error_codes import http_status
from stateworker.errors import (
    InternalError,
    InvalidRequest,
    PermissionDenied,
    ReservedScope,
    ResourceExhausted,
    StateError,
    UnknownCaller,
    shown,
)
from stateworker.events.history import history_document
from stateworker.events.model import Event, document_json
from stateworker.events.watch import Watch
from stateworker.settings import Settings
from stateworker.specs import GET
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.uicontent import console_page, ui_file

# The console's calls: read-only in `off` mode, unless local (hosts.local_only: app/http.py)
CONSOLE_HEADER = "x-stateworker-console"
LOGIN_BYTES = 4096  # a login form (a principal's name and password: 256 bytes each at most)
JSON = "application/json"

Handler = Callable[[Request], Awaitable[Response]]
# The page is never shown in another page's frame: a site that framed it could lay its own
# bait over it and land the user's click on a console button (a Delete, one click, on a key
# the frame's address opened), whose request carries the console's own Origin and session.
_PAGE_HEADERS = {"Cache-Control": "no-cache", "X-Frame-Options": "DENY",
                 "Content-Security-Policy": "frame-ancestors 'none'"}


def console_routes(state: RedisState, logins: Logins, stopping: anyio.Event,
                   tails: Tails, rates: Rates) -> list[BaseRoute]:
    """The console's routes (module docstring); `stopping`: set when the service stops (a
    live tail ends then, rather than hold the stop for the server's grace period); `tails`:
    the live tails open (their caps; /metrics reads them); `rates`: the recent counters."""

    async def page(request: Request) -> Response:
        name = request.path_params.get("name", "")
        found = (console_page(), "text/html; charset=utf-8") if not name else ui_file(name)
        if found is None:
            return _error(InvalidRequest("no such console file", {"path": request.url.path}), 404)
        return Response(found[0], 200, media_type=found[1], headers=_PAGE_HEADERS)

    async def session(request: Request) -> Response:
        principal = await _principal(logins, request, needed=False)
        return _json(_session(state, principal))

    async def login(request: Request) -> Response:
        try:
            form = msgspec.json.decode(await read_body(request.receive, LOGIN_BYTES, "login: the body"),
                                      type=dict[str, str])
        except msgspec.DecodeError as exc:  # (not JSON, or not an object of strings)
            raise InvalidRequest(f"login: {exc}", {"path": "body"}) from None
        if not logins.required:
            raise InvalidRequest("login: the service runs in off mode, where nobody logs in",
                                 {"path": "auth"})
        principal = form.get("principal", "")
        token = await logins.login(principal, form.get("password", ""))
        response = _json(_session(state, principal))
        # Secure when the page is https (a TLS proxy in front: the service itself speaks
        # http): else a browser sends the cookie in clear to any http:// URL of the host,
        # one a network attacker makes it load.
        secure = request.headers.get("origin", "").lower().startswith("https://")
        response.set_cookie(COOKIE, token, max_age=int(SESSION_S), httponly=True,
                            samesite="strict", path="/", secure=secure)
        return response

    async def logout(request: Request) -> Response:
        await logins.logout(request.cookies.get(COOKIE))
        response = _json(_session(state, None))
        response.delete_cookie(COOKIE, path="/")
        return response

    async def overview(request: Request) -> Response:
        principal = await _principal(logins, request)
        if principal is not None and not state.access.is_admin(principal):
            raise PermissionDenied(
                f"the overview shows every service, trigger and principal: principal "
                f"{principal!r} is not an admin", {"principal": principal})
        return _json(await console_reads.overview(state, rates))

    async def history(request: Request) -> Response:
        scope, key = _text(request, "scope"), _text(request, "key")
        if scope is None or key is None:
            raise InvalidRequest("history: scope and key are required", {"path": "scope"})
        _may_read(state, await _principal(logins, request), scope)
        return _json(await history_document(state.conn, state.keys, scope, key))

    async def counts(request: Request) -> Response:
        principal = await _principal(logins, request)
        named = [scope for scope in request.query_params.getlist("scope") if scope]
        if len(named) > console_reads.COUNTED_SCOPES:
            raise InvalidRequest(f"counts: at most {console_reads.COUNTED_SCOPES} scopes",
                                 {"path": "scope", "limit": console_reads.COUNTED_SCOPES})
        readable = []
        for scope in named:
            try:
                _may_read(state, principal, scope)
            except StateError:  # (a scope it may not read: no count, as no listing)
                continue
            readable.append(scope)
        return _json(await console_reads.counts(state, readable))

    async def tail(request: Request) -> Response:
        scope, key, prefix = (_text(request, name) for name in ("scope", "key", "prefix"))
        principal = await _principal(logins, request)
        _may_read(state, principal, scope)
        caller = principal if principal is not None else \
            f"address {request.client.host if request.client else '?'}"
        watch = Watch(state.conn.url, state.settings, scope=scope, key=key)  # (checks names)
        if request.method == "HEAD":  # (the answer's head alone: no tail opened, no slot held)
            return Response(None, 200, media_type="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
        tails.take(caller)
        try:
            await watch.open()
        except BaseException:
            tails.give_back(caller)
            with anyio.CancelScope(shield=True):
                await watch.close()
            raise
        holds = logins.still_holds(request, principal)

        async def allowed(scope: str) -> bool:  # (a role may lose the scope while the tail runs)
            try:
                _may_read(state, principal, scope)
            except StateError:
                return False
            return await holds()

        events = _events(watch, prefix, lambda scope: _shown(state, principal, scope),
                         holds, allowed, lambda: tails.give_back(caller))
        return _Tail(events, stopping, media_type="text/event-stream",
                     headers={"Cache-Control": "no-cache"})

    return [
        Route("/", lambda _: RedirectResponse("/console/"), methods=["GET"]),
        Route("/console/", page, methods=["GET"]),
        Route("/console/{name}", page, methods=["GET"]),
        Route("/v1/console/session", _answering(session), methods=["GET"]),
        Route("/v1/console/login", _answering(login), methods=["POST"]),
        Route("/v1/console/logout", _answering(logout), methods=["POST"]),
        Route("/v1/console/overview", _answering(overview), methods=["GET"]),
        Route("/v1/console/history", _answering(history), methods=["GET"]),
        Route("/v1/console/counts", _answering(counts), methods=["GET"]),
        Route("/v1/console/tail", _answering(tail), methods=["GET"]),
    ]


class _Tail(StreamingResponse):
    """A stream that ends when the service stops: an open tail never ends by itself."""

    def __init__(self, content: AsyncIterator[bytes], stopping: anyio.Event,
                 **options: Any) -> None:
        super().__init__(content, **options)
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            async def stop() -> None:
                await self.stopping.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(stop)
            await super().__call__(scope, receive, send)
            tg.cancel_scope.cancel()


def _answering(handler: Handler) -> Handler:
    """`handler` with its StateError answered as the call API answers one."""
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except StateError as exc:
            return _error(exc, http_status(exc.code))
        except Exception as exc:  # a bug costs one request, not the server
            error = InternalError(f"{request.url.path} failed inside the service: "
                                  f"{type(exc).__name__}")
            return _error(error, 500)
    return answered


def _json(document: Any) -> Response:
    return Response(msgspec.json.encode(document), 200, media_type=JSON)


def _error(exc: StateError, status: int) -> Response:
    return Response(msgspec.json.encode({"ok": False, "error": {
        "code": exc.code, "message": str(exc), "details": exc.details}}), status,
        media_type=JSON)


def _text(request: Request, name: str) -> str | None:
    return request.query_params.get(name) or None


async def _principal(logins: Logins, request: Request, *, needed: bool = True) -> str | None:
    """The request's principal (`acl` mode); UnknownCaller when it needs one and has none."""
    if not logins.required:
        return None
    principal = await logins.principal_of(request)
    if principal is None and needed:
        raise UnknownCaller("acl mode: log in first (POST /v1/console/login) or send "
                            "Authorization: Basic <principal:password>", {"path": "authorization"})
    return principal


def _session(state: RedisState, principal: str | None) -> dict[str, Any]:
    """What the page needs to know of who it acts as: in `off` mode it is read-only but on
    a loopback bind answering to loopback names alone (`local`: this machine's programs alone
    reach it, no proxy in front; hosts.local_only); in `acl` mode a
    logged-in principal may try writes (its roles decide each)."""
    acl = state.settings.auth == "acl"
    local = not acl and local_only(state.settings)
    return {"auth": state.settings.auth, "principal": principal, "local": local,
            "admin": not acl or (principal is not None and state.access.is_admin(principal)),
            "writes": (acl and principal is not None) or local}


def _may_read(state: RedisState, principal: str | None, scope: str | None) -> None:
    """A read grant on `scope` (None: on every scope) for `principal` (None: trusted), and,
    as the public functions do, no claimed or reserved scope but for an admin: a private
    namespace is read through its accessors alone, whatever the door."""
    if principal is None:
        return
    state.access.check(principal, GET.name, None if scope is None else [scope])
    if scope is not None and not state.access.is_admin(principal) and \
            scope in validate.hidden_scopes(state):
        owner = state.claims.owner(scope)
        raise ReservedScope(
            f"scope {shown(scope)} is " + (f"claimed by namespace {shown(owner)}: only its "
                                           f"accessors ({owner}::state::get, ...) serve it"
                                           if owner else "reserved for the service's own "
                                           "bookkeeping"),
            {"path": "scope", "scope": scope, **({"namespace": owner} if owner else {})})


def _shown(state: RedisState, principal: str | None, scope: str) -> bool:
    """Whether the tail shows `principal` an event of `scope` (an unscoped tail: the claimed
    and reserved scopes left out, as listings leave them out)."""
    return principal is None or state.access.is_admin(principal) or \
        scope not in validate.hidden_scopes(state)


async def _events(watch: Watch, prefix: str | None, shown: Callable[[str], bool],
                  holds: Callable[[], Awaitable[bool]],
                  allowed: Callable[[str], Awaitable[bool]],
                  ended: Callable[[], None]) -> AsyncIterator[bytes]:
    """The watch's events as server-sent events; its bookmarks as comments, which keep the
    connection alive (and show a closed one: the write fails, the watch closes). The login
    (`holds`) and the read grant on each event's scope (`allowed`) are asked again at every
    item, not only at the open: the stream ends once the login is over (a logout, a new
    password) or the principal may no longer read what comes."""
    try:
        yield b": watching\n\n"
        async for item in watch:
            if not isinstance(item, Event):
                if not await holds():
                    return
                yield b": " + item.revision.encode() + b"\n\n"
            elif (prefix is None or item.key.startswith(prefix)) and shown(item.scope):
                if not await allowed(item.scope):
                    return
                yield b"data: " + document_json(item) + b"\n\n"
    finally:
        ended()
        with anyio.CancelScope(shield=True):
            await watch.close()


class Tails:
    """The live tails open, in all and per caller, each within its cap (settings
    `max_tails`, `max_tails_per_caller`): a tail holds a Redis connection, and Redis's
    `maxclients` is everyone's."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.open: dict[str, int] = {}
        self.refused = 0  # tails refused at a cap, since start

    def take(self, caller: str) -> None:
        total, mine = sum(self.open.values()), self.open.get(caller, 0)
        if total >= self.settings.max_tails or mine >= self.settings.max_tails_per_caller:
            self.refused += 1
            which, limit = (("open in all", self.settings.max_tails)
                            if total >= self.settings.max_tails else
                            (f"open by {caller}", self.settings.max_tails_per_caller))
            raise ResourceExhausted(
                f"tail: {limit} live tails are {which} already (STATEWORKER_MAX_TAILS, "
                "STATEWORKER_MAX_TAILS_PER_CALLER): close one first",
                {"path": "tail", "limit": limit, "open": total if "all" in which else mine})
        self.open[caller] = mine + 1

    def give_back(self, caller: str) -> None:
        left = self.open.get(caller, 0) - 1
        if left > 0:
            self.open[caller] = left
        else:
            self.open.pop(caller, None)
