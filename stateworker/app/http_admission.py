"""Which connections the HTTP face takes (app/http_server.py): at most
`STATEWORKER_HTTP_MAX_CONNECTIONS` open at once, at most `..._PER_CLIENT` of them from one
client address, and no more than the process may open files for (`ulimit -n`) beside its own.

Counted as a connection is accepted, before a byte of it is read. uvicorn's
`limit_concurrency` counted connections only once a request's head had ended, so connections
that sent nothing were all kept: 3,000 idle ones held 3,000 file descriptors (every request
beyond 1,024 answered 503, the honest caller's too), and past `ulimit -n` the process could
open no socket at all, its Redis reconnects included (a bus that lost its connection served
nobody until the flood stopped). One client address holding every place was the same
refusal of everyone else (decision 0077).

A connection beyond a limit is answered 503 UNAVAILABLE at once, naming the limit, and
closed lingering (app/http_flow.py `close_lingering`: closed at once, a request the client
had sent already, unread, would make the close a reset, which loses the 503 on its way), for
`REFUSING_S` at most. At most `REFUSING_MAX` are kept so at once; beyond, closed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from http import HTTPStatus
from typing import Any

import msgspec

from stateworker.app.http_flow import close_lingering
from stateworker.errors import StateError, Unavailable

log = logging.getLogger("stateworker.http")

# Files the process keeps beside the HTTP face's connections and the live tails' Redis
# connections: its Redis connections (a few a server, more on a cluster), PostgreSQL, the
# loop's, the logs'; measured: 19 at the start on one Redis.
FD_RESERVE = 128
REFUSING_MAX = 64  # refused connections kept open a moment for their 503 (above)
REFUSING_S = 1.0


class Admission:
    """The HTTP face's connections open, in all and per client address, within their limits
    (`limit` may be lower than the setting: `file_budget`)."""

    def __init__(self, limit: int, per_client: int, setting: int) -> None:
        self.limit = limit
        self.per_client = per_client
        self.setting = setting  # STATEWORKER_HTTP_MAX_CONNECTIONS, for the refusal's words
        self.open: dict[str, int] = {}  # client address -> connections open
        self.total = 0
        self.refusing = 0  # refused connections kept open for their 503 (REFUSING_MAX)
        self.refused = 0  # connections refused since the start

    def admit(self, client: str) -> Unavailable | None:
        """Take a place for a connection from `client` (its address); None when taken, else
        the refusal naming the limit (the connection is to be answered with it and closed)."""
        mine = self.open.get(client, 0)
        if self.total >= self.limit:
            lowered = "" if self.limit == self.setting else (
                f", lowered from STATEWORKER_HTTP_MAX_CONNECTIONS={self.setting} to fit the "
                "process's open-file limit (ulimit -n)")
            error = Unavailable(
                f"the HTTP face holds at most {self.limit} connections at once "
                f"(STATEWORKER_HTTP_MAX_CONNECTIONS{lowered}): try again in a moment",
                {"path": "connections", "limit": self.limit})
        elif mine >= self.per_client:
            error = Unavailable(
                f"client {client} holds {mine} connections to the HTTP face, the most one "
                "client address may (STATEWORKER_HTTP_MAX_CONNECTIONS_PER_CLIENT): close one "
                "or try again in a moment",
                {"path": "connections", "limit": self.per_client, "client": client})
        else:
            self.open[client] = mine + 1
            self.total += 1
            return None
        self.refused += 1
        return error

    def leave(self, client: str) -> None:
        """A connection `admit` took a place for is gone."""
        self.total -= 1
        left = self.open.get(client, 0) - 1
        if left > 0:
            self.open[client] = left
        else:
            self.open.pop(client, None)


def refuse(transport: asyncio.Transport, admission: Admission, refusal: Unavailable
           ) -> asyncio.TimerHandle | None:
    """Answer a connection refused (503 at once, naming the limit), and close it when the
    client closes, or REFUSING_S later (the module's docstring: why not at once), or at once
    past REFUSING_MAX; the timer of that close, to cancel when it closed first."""
    transport.write(error_answer(503, refusal))
    if admission.refusing >= REFUSING_MAX:
        transport.close()
        return None
    admission.refusing += 1
    return close_lingering(transport, REFUSING_S)


def error_document(error: StateError) -> bytes:
    """The call API's error document of a refusal made before any app saw the request."""
    return msgspec.json.encode({"id": None, "ok": False, "error": {
        "code": error.code, "message": str(error), "details": error.details}})


def error_answer(status: int, error: StateError) -> bytes:
    """A whole answer, head and body, refusing with `error`, and saying the connection
    closes (a refused connection's, or a head past its limits': 503, 414, 431)."""
    body = error_document(error)
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" \
           b"connection: close\r\n\r\n%s" % (status, HTTPStatus(status).phrase.encode(),
                                             len(body), body)


class Refusal:
    """The answer to a request refused at a limit (the request's place in its connection's
    order): 503, its error document, and a close."""

    def __init__(self, error: StateError) -> None:
        self.body = error_document(error)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"connection", b"close"),
            (b"content-length", str(len(self.body)).encode())]})
        await send({"type": "http.response.body", "body": self.body})


def file_budget(wanted: int, tails: int) -> int:
    """The connections the HTTP face may hold: `wanted` (the setting), or fewer when the
    process may not open that many files beside its own (`FD_RESERVE`) and the live tails'
    Redis connections (`tails`). The soft open-file limit is raised first, as far as the hard
    one allows (a systemd service starts with 1,024 soft and 524,288 hard); what still does
    not fit is said once, at the start."""
    need = wanted + tails + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):  # (a sandbox may refuse: then as is)
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    fits = max(1, soft - tails - FD_RESERVE)
    log.warning("the HTTP face holds at most %d connections, not %d "
                "(STATEWORKER_HTTP_MAX_CONNECTIONS): the process may open %d files (ulimit -n; "
                "its hard limit) and keeps %d of them for its Redis, PostgreSQL and live tails' "
                "connections; raise the limit (LimitNOFILE=, docker run --ulimit nofile=) to "
                "hold more", fits, wanted, soft, tails + FD_RESERVE,
                extra={"event": "http.files", "limit": fits, "files": soft})
    return fits
