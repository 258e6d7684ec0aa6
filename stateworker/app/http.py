"""The service's HTTP face (`stateworker serve --http HOST:PORT`, STATEWORKER_HTTP; off by
default): a Starlette app served by uvicorn on httptools on the service's own event loop
(app/http_server.py), its busiest paths sent past Starlette's router (app/hot_paths.py).

    POST /v1/call/{function}   the function's JSON body in, the bus's reply document out
                               (`{"id":…,"ok":…,"result"|"error":…}`), the error's code
                               mapped to an HTTP status (error_codes.HTTP_STATUS)
    GET  /metrics              Prometheus text (app/metrics.py)
    GET  /healthz              200 while the process serves
    GET  /readyz               200 when Redis (and the bus's own) answers a PING and has not lost the data
                               PostgreSQL holds (STORE_LOST), else 503 naming why
    /v1.0/state/...            Dapr's state API shape (app/dapr.py)

A call runs in this process as a bus call would (`functions.prepare` on the service's
catalog, the same plans), so the result is the same bytes. `Idempotency-Key` is the call's
id: it is bound to its function and body and its reply recorded for the dedupe window, as
a bus call's id; `X-Stateworker-Context` carries the bus entry's `context` (a JSON object),
`X-Stateworker-Caller` its `caller` (`off` mode; in `acl` mode the principal alone).
In `acl` mode a request acts as the principal it proves (app/logins.py: `Authorization:
Basic`, or the console's session cookie), whose roles decide as over the bus; without one it
is UNKNOWN_CALLER (401). The console (app/console.py) sends `X-Stateworker-Console`: in `off`
mode its writes are refused (nobody logs in: a page anyone on the network opens must not edit
state by a click), unless the face is bound to a loopback address, where only this machine's
programs reach it (a developer's own service).

Why Starlette: it runs on anyio (the project's concurrency), is small and well kept. Why
uvicorn on httptools: it serves ASGI on a loop the caller already runs, at the least CPU a
request of the servers measured (decision 0057; Hypercorn's h11 took 5x as much).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import msgspec
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive

from stateworker import tracing
from stateworker.app.batches import Batches
from stateworker.app.bodies import read_body
from stateworker.app.cli.parser import version
from stateworker.app.console import CONSOLE_HEADER, Tails, console_routes
from stateworker.app.console_reads import Rates
from stateworker.app.dapr import dapr_routes
from stateworker.app.dapr_requests import dapr_stores
from stateworker.app.hosts import HostGuard, allowed_hosts, local_only
from stateworker.app.hot_paths import CallDoor, HotPaths
from stateworker.app.http_admission import Admission, file_budget
from stateworker.app.http_server import ServerOnOurLoop, listening, server_config
from stateworker.app.logins import Logins, SameOrigin
from stateworker.app.metrics import Metrics
from stateworker.app.url_text import UrlText
from stateworker.bus.entries import (
    MAX_ID_BYTES,
    call_digest,
    own_call_id,
    parse_context,
    principal_caller,
)
from stateworker.bus.protocol import reply_document
from stateworker.bus.runtime import BusRuntime
from stateworker.context import CallContext
from stateworker.engines.catalog import CATALOG
from stateworker.error_codes import http_status
from stateworker.errors import (
    InternalError,
    InvalidRequest,
    PermissionDenied,
    ResourceExhausted,
    StateError,
    UnknownCaller,
    shown,
)
from stateworker.schemas import encoder
from stateworker.state import functions
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import RedisFull
from stateworker.transport.retry import ping_trouble

log = logging.getLogger("stateworker.http")

JSON = "application/json"
CONTEXT_HEADER = b"x-stateworker-context"
CALLER_HEADER = b"x-stateworker-caller"
_CONSOLE = CONSOLE_HEADER.encode()
# In `acl` mode /metrics is for a principal with a read role on `*` (a scraper's own): its
# labels name every stream and partition, as listing every scope would.
METRICS_PROBE = "state::list_groups"


def http_app(state: RedisState, runtime: BusRuntime, batches: Batches,
             stopping: anyio.Event, rates: Rates, logins: Logins,
             admission: Admission) -> ASGIApp:
    """The ASGI app of the HTTP face of the service of `state` and bus `runtime`; its calls
    run through `batches` (app/batches.py); `stopping` is set when the service stops;
    `rates`: the counters' recent samples the console's overview shows; `logins`: who a
    request acts as (`acl` mode); `admission`: its connections (/metrics counts them)."""
    tails = Tails(state.settings)
    metrics = Metrics(state, runtime, tails, admission)
    local = local_only(state.settings)

    async def answer(fn: str, headers: dict[bytes, bytes], receive: Receive,
                     request: Callable[[], Request]) -> tuple[bytes, int]:
        """A call's reply document and HTTP status (CallDoor's, and the route's)."""
        started = time.perf_counter()
        call_id = None
        try:
            call_id = _utf8(headers.get(b"idempotency-key"), "Idempotency-Key")
            principal = await _principal(logins, request, headers, fn, local)
            caller = _named_caller(headers, principal)
            body = await read_body(receive, runtime.options.max_body_bytes)
            if principal is not None:  # (the body came later: a new password may have too)
                logins.still_proven(request(), principal)
            result = await _run(state, batches, fn, body, call_id, headers.get(CONTEXT_HEADER),
                                runtime.options.max_context_bytes, principal,
                                _trace_headers(headers), caller)
            document, status, code = reply_document(call_id, result, None), 200, "OK"
        except StateError as exc:
            document, status, code = reply_document(call_id, None, exc), http_status(
                exc.code), exc.code
        except Exception as exc:  # a bug costs one call, not the server
            log.exception("HTTP call failed", extra={"event": "http.crashed", "fn": fn})
            error = InternalError(f"{fn} failed inside the service: {type(exc).__name__}")
            document, status, code = reply_document(call_id, None, error), 500, error.code
        metrics.http_call(fn, code, started)
        return document, status

    async def call(request: Request) -> Response:  # (the route's: CallDoor answers first)
        document, status = await answer(request.path_params["function"], _headers(request),
                                        request.receive, lambda: request)
        return Response(document, status, media_type=JSON)

    async def read(request: Request) -> bytes:  # (Dapr's routes read their bodies with this)
        return await read_body(request.receive, runtime.options.max_body_bytes)

    async def healthz(_: Request) -> Response:
        return Response(b'{"status":"ok"}', 200, media_type=JSON)

    async def readyz(_: Request) -> Response:
        reason = await redis_unready(state)
        if reason is None:
            return Response(b'{"status":"ready"}', 200, media_type=JSON)
        return Response(msgspec.json.encode({"status": "unready", "reason": reason}), 503,
                        media_type=JSON)

    async def prometheus(request: Request) -> Response:
        if logins.required:  # (its labels name every principal's stream)
            try:
                principal = await logins.principal_of(request)
                if principal is None:
                    raise UnknownCaller("acl mode: /metrics needs the Authorization: Basic "
                                        "of a principal with read on * (docs/http.md)",
                                        {"path": "authorization"})
                state.access.check(principal, METRICS_PROBE, None)
            except StateError as exc:
                return Response(reply_document(None, None, exc), http_status(exc.code),
                                media_type=JSON)
        text, content_type = await metrics.exposition()
        return Response(text, 200, media_type=content_type)

    async def native(request: Request, fn: str, body: bytes) -> bytes:  # (Dapr's routes')
        started = time.perf_counter()
        try:
            principal = None
            if logins.required:
                principal = await logins.principal_of(request)
                if principal is None:
                    raise UnknownCaller(
                        "acl mode: Dapr's state API needs a principal: send `dapr-api-token: "
                        "<principal>:<password>` (the SDKs' DAPR_API_TOKEN) or "
                        "`Authorization: Basic` (docs/http.md)", {"path": "dapr-api-token"})
            result = await _run(state, batches, fn, body, None, None,
                                runtime.options.max_context_bytes, principal)
        except StateError as exc:
            metrics.http_call(fn, exc.code, started)
            raise
        metrics.http_call(fn, "OK", started)
        return result

    routes = [
        *console_routes(state, logins, stopping, tails, rates),
        *dapr_routes(native, read, dapr_stores(state.settings), "stateworker", version(),
                     state.settings.max_call_bytes),
        Route("/v1/call/{function:path}", call, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    # The guards first, for every request; then the hot paths past Starlette's routing. The
    # call API's requests are answered in front of it all, with the same guards (CallDoor).
    hosts = allowed_hosts(state.settings)
    return CallDoor(Starlette(routes=routes, exception_handlers={
        404: _no_route, 405: _no_route}, middleware=[
        Middleware(HostGuard, hosts=hosts), Middleware(SameOrigin), Middleware(UrlText),
        Middleware(HotPaths, routes=routes)]), answer, hosts)


async def _no_route(request: Request, exc: Exception) -> Response:
    """No such path, or not with this method: a JSON error document as every other refusal
    (code, message naming the path and the methods it takes), not Starlette's plain text."""
    status, path = getattr(exc, "status_code", 404), request.url.path
    headers: dict[str, str] = getattr(exc, "headers", None) or {}
    allowed = headers.get("Allow", "")
    error = InvalidRequest(
        f"{request.method} {shown(path)}: this path takes {allowed} only", {
            "path": path, "method": request.method, "allowed": allowed.split(", ")}
    ) if status == 405 else InvalidRequest(
        f"{shown(path)}: no such path (the call API is POST /v1/call/<function>: "
        "docs/http.md)", {"path": path})
    return Response(reply_document(None, None, error), status, media_type=JSON,
                    headers=headers)


async def _principal(logins: Logins, request: Callable[[], Request],
                     headers: dict[bytes, bytes], fn: str, local: bool) -> str | None:
    """The principal a call acts as (`acl` mode; None in `off` mode). Raises UnknownCaller
    without one, and PermissionDenied for a write from the console in `off` mode unless the
    face is `local` (bound to a loopback address and answering to loopback names alone:
    hosts.local_only)."""
    if logins.required:
        principal = await logins.principal_of(request())
        if principal is None:
            raise UnknownCaller(
                "acl mode: a call over HTTP needs a principal: send `Authorization: Basic "
                "<principal:password>` or log in to the console (docs/http.md)",
                {"path": "authorization"})
        return principal
    if _CONSOLE in headers and fn not in CATALOG.reads and not local:
        raise PermissionDenied(
            f"{fn}: the console is read-only in off mode (no principal logs in) unless the "
            "HTTP face is bound to a loopback address (STATEWORKER_HTTP=127.0.0.1:<port>) and "
            "answers to loopback names alone (STATEWORKER_HTTP_HOSTS); "
            "writes go through the call API, the bus or the CLI", {"path": "fn", "fn": fn})
    return None


def _named_caller(headers: dict[bytes, bytes], principal: str | None) -> str | None:
    """The caller a call names (`X-Stateworker-Caller`, the bus entry's `caller`): whose
    cursors and private namespaces it uses. `off` mode trusts it, as the bus does; in `acl`
    mode the caller is the principal, and a header naming anyone else is refused."""
    named = _utf8(headers.get(CALLER_HEADER), "X-Stateworker-Caller")
    if named is not None and not 1 <= len(named.encode()) <= MAX_ID_BYTES:
        raise InvalidRequest(f"X-Stateworker-Caller: must be 1 to {MAX_ID_BYTES} bytes, got "
                             f"{len(named.encode())}", {"path": "X-Stateworker-Caller",
                                                        "limit": MAX_ID_BYTES})
    return named if principal is None else principal_caller(principal, named)


def _headers(request: Request) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of a repeated one as Starlette's
    `request.headers.get` gives: a call looks up several, most of them absent, and a dict made
    once beats a scan of the list (and a KeyError) for each."""
    return dict(reversed(request.scope["headers"]))


def _utf8(value: bytes | None, header: str) -> str | None:
    """A header's text, as the bus takes the same field: UTF-8 (what curl and the SDKs send
    for text beyond ASCII). Read as Starlette reads headers (latin-1), `café` sent as UTF-8
    became `cafÃ©`: another call id than the same id over the bus."""
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{header}: not valid UTF-8 text (byte {exc.start} is "
                             f"0x{value[exc.start]:02X})", {"path": header}) from None


_TRACE_HEADERS = [(name, name.encode()) for name in (tracing.TRACEPARENT, tracing.TRACESTATE)]


def _trace_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    """W3C trace context sent as HTTP headers (`traceparent`, `tracestate`): what a bus call
    carries in its `context` (a header wins over the context's field)."""
    return {name: value.decode("latin-1") for name, raw in _TRACE_HEADERS
            if (value := headers.get(raw)) is not None}


async def _run(state: RedisState, batches: Batches, fn: str, body: bytes, call_id: str | None,
               context_raw: bytes | None, context_limit: int, principal: str | None,
               trace_headers: dict[str, str] | None = None, caller: str | None = None) -> bytes:
    """One call in this process, as the bus runs it (with the other calls in flight: one
    pipeline), as `principal` (`acl` mode) or trusted (None), by `caller` (the principal in
    `acl` mode; `off` mode: the one the request names, if any); its result's JSON. A trace
    context (headers, or the context's fields) continues in a service span, as a bus call's
    (tracing.py)."""
    if call_id is not None and (not call_id or len(call_id.encode()) > MAX_ID_BYTES):
        raise InvalidRequest(f"Idempotency-Key: must be 1 to {MAX_ID_BYTES} bytes",
                             {"path": "Idempotency-Key", "limit": MAX_ID_BYTES})
    # (its bytes as sent, as the bus's `context` field: JSON is UTF-8, so a header read as
    # latin-1 and encoded again named another org, user or dag than the bus's same context)
    context = parse_context(context_raw, context_limit, "X-Stateworker-Context")
    if trace_headers:
        context = {**context, **trace_headers}
    own = None if call_id is None else own_call_id(principal, call_id)
    ctx = CallContext(context=context, call_id=own, principal=principal,
                      caller=principal if caller is None else caller,
                      call_digest=None if call_id is None else call_digest(fn, body))
    span = None
    if tracing.TRACEPARENT in context:
        span, ctx = tracing.start_call(fn, ctx, call_id)
    try:
        result = await batches.execute(functions.prepare(state, fn, body, ctx, CATALOG))
        if isinstance(result, RedisFull) and call_id is not None:
            raise _full_again(result, call_id)
        if isinstance(result, StateError):
            raise result
    except StateError as exc:
        if span is not None:
            tracing.finish(span, exc.code)
        raise
    except BaseException:
        if span is not None:
            tracing.finish(span, InternalError.code)
        raise
    if span is not None:
        tracing.finish(span, tracing.OK)
    return encoder.encode(result)


def _full_again(full: RedisFull, call_id: str) -> ResourceExhausted:
    """Redis, full, refused a call's script before it could find the call's record: what
    this request wrote is nothing, but a request before it with the same key may have been
    applied (its reply lost), so "nothing was written" would be false of the call. (The bus
    leaves such an entry pending instead: bus/serving.py.)"""
    return ResourceExhausted(
        "Redis refused the write because it reached its memory limit (maxmemory): this "
        f"request ran nothing; an earlier request with Idempotency-Key {shown(call_id)} may "
        "have been applied. Send it again once Redis has room: it is answered from its "
        "record, or runs", {**full.details, "path": "Idempotency-Key"})


async def redis_unready(state: RedisState) -> str | None:
    """None when Redis answers a PING within a second and holds the data (not STORE_LOST);
    else why not. With the bus on a Redis of its own (STATEWORKER_BUS_REDIS_URL) that one
    must answer too: without it no call comes in nor goes out. Nor ready while a Redis may
    evict the service's keys (a policy set since the start: lifecycle.eviction_loop)."""
    if state.lost is not None:
        return f"STORE_LOST: writes are refused: {state.lost}; run `stateworker restore`"
    if state.evicting is not None:
        return state.evicting
    conns = [state.conn] if state.bus_conn is state.conn else [state.conn, state.bus_conn]
    for conn, what in zip(conns, ("Redis", "the bus's Redis"), strict=False):
        if trouble := await ping_trouble(conn, what):
            return trouble
    return None


async def serve_http(state: RedisState, runtime: BusRuntime, bind: str, stop: anyio.Event, *,
                     task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve the HTTP face on `bind` until `stop` is set; `task_status` gets the address it
    listens on (`host:port`, the port chosen when `bind` asked for 0)."""
    sock = listening(bind)  # bound and listening here: the port is known, a client may connect
    name = sock.getsockname()
    address = f"{name[0]}:{name[1]}"
    log.info("HTTP on http://%s", address, extra={"event": "http.start", "http": address})
    task_status.started(address)
    batches = Batches(state)
    rates = Rates(state)
    logins = Logins(state)
    settings = state.settings
    admission = Admission(file_budget(settings.http_max_connections, settings.max_tails),
                          settings.http_max_connections_per_client, settings.http_max_connections)
    server = ServerOnOurLoop(server_config(http_app(state, runtime, batches, stop, rates,
                                                    logins, admission), admission))
    try:
        await logins.open()
        async with anyio.create_task_group() as tg:
            await tg.start(batches.run)
            tg.start_soon(rates.run)

            async def stopping() -> None:
                await stop.wait()
                server.should_exit = True  # (seen within its tick, 0.1 s; then the grace)

            tg.start_soon(stopping)
            try:
                await server.serve(sockets=[sock])
            finally:
                with anyio.CancelScope(shield=True):
                    await logins.close()
            tg.cancel_scope.cancel()
    finally:
        # The listening socket closed however the face ends: uvicorn closes it in its
        # shutdown alone, which a serve stopped during its startup, or cancelled in its main
        # loop or before it began, never reaches (a stop soon after the start left the port
        # accepting connections that no one answered, until the process ended).
        for served in getattr(server, "servers", ()):  # (made by its startup)
            served.close()
        sock.close()
