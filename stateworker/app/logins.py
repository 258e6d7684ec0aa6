"""Who an HTTP request acts as in `acl` mode: a principal, proven by its Redis password.

Redis keeps the passwords (a principal's ACL user, docs/security.md), so the service never
stores one: a login sends `AUTH <principal> <password>` on a connection of its own to the
service's Redis, kept for every proof; Redis's OK is the proof, WRONGPASS the refusal (asked
for a name that is no principal too: a refusal's timing names none). Two ways in:

- the console's login form (`POST /v1/console/login`): a session, a random token in an
  HttpOnly, SameSite=Strict cookie, kept in this process's memory for `SESSION_S` (a replica
  of the service does not know another's sessions; a restart logs everyone out); at most
  `SESSIONS_PER_PRINCIPAL` a principal (a new login ends its oldest) and `MAX_SESSIONS` in
  all (beyond: RESOURCE_EXHAUSTED), so logging in again and again fills no memory;
- `Authorization: Basic <principal:password>` on any request (programs), or Dapr's
  `dapr-api-token: <principal>:<password>` (its SDKs send DAPR_API_TOKEN so): proven the same
  way, the proof remembered for `PROOF_S` by the password's SHA-256, so a busy caller costs
  one AUTH a minute.

Both end when the principal's record changes (`principal passwd` writes when the password
changed; other roles, act_as): every replica's registry follower reloads the records within
a moment, and a session or proof made under the record of before is over.

In `off` mode nobody logs in: there are no principals (the request is trusted as a bus call
of whoever reaches Redis is).

`SameOrigin` guards both modes from other web sites: a browser sends any page's POST to a
service on localhost or the intranet (a form, `fetch` with `no-cors`), with the console's
cookie too in `acl` mode were it not SameSite. Every request that may change something
(any method but GET, HEAD, OPTIONS) whose `Origin` is not the service's own address is
refused before it is read; programs (curl, SDKs) send no `Origin`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import time
import urllib.parse
from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from stateworker.app.hosts import send_refusal
from stateworker.errors import (
    InvalidRequest,
    PermissionDenied,
    ResourceExhausted,
    UnknownCaller,
    shown,
)
from stateworker.state.core.grants import Principal
from stateworker.state.core.store import RedisState
from stateworker.transport.cluster_map import seeds_of
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost, ReplyError

COOKIE = "sw_session"
SESSION_S = 12 * 3600.0  # a console login lasts this long
PROOF_S = 60.0  # a Basic credential proven is trusted this long before Redis is asked again
MAX_FIELD_BYTES = 256  # a principal's name or password, as sent
SESSIONS_PER_PRINCIPAL = 16  # a principal's sessions at most: a new login ends its oldest
MAX_SESSIONS = 10_000  # sessions of a process at most: a login beyond is refused


class Logins:
    """The sessions and proven credentials of one service process."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        # token -> (principal, expires, its record then); (principal, sha256) -> (expires,
        # its record then): a session or proof ends when the record changes (a new password,
        # other roles: `rotated_ms`, grants.Principal), on every replica within a moment
        # (the registry follower reloads the records).
        # Both in the order they expire (each lives as long; a proof renewed is put last),
        # so the expired ones are found at the front, not by a pass over all.
        self.sessions: dict[str, tuple[str, float, Principal | None]] = {}
        self.proofs: dict[tuple[str, bytes], tuple[float, Principal | None]] = {}
        self.tokens: dict[str, dict[str, None]] = {}  # principal -> its tokens, oldest first
        self.proof_conn: RedisConnection | None = None  # (_auth's)

    @property
    def required(self) -> bool:
        return self.state.settings.auth == "acl"

    async def login(self, principal: str, password: str) -> str:
        """A new session's token for `principal` once Redis accepts its password."""
        record = await self._prove(principal, password)
        self._forget_expired()
        mine = self.tokens.get(principal, {})
        if len(mine) >= SESSIONS_PER_PRINCIPAL:
            self.logout(next(iter(mine)))  # (its oldest: the total stays as it was)
        elif len(self.sessions) >= MAX_SESSIONS:
            raise ResourceExhausted(
                f"login: {MAX_SESSIONS} console sessions are open in this process already "
                "(MAX_SESSIONS): try again when some have ended, or use Basic credentials",
                {"path": "login", "limit": MAX_SESSIONS})
        token = secrets.token_urlsafe(32)
        self.sessions[token] = (principal, time.monotonic() + SESSION_S, record)
        self.tokens.setdefault(principal, {})[token] = None
        return token

    def logout(self, token: str | None) -> None:
        session = self.sessions.pop(token, None) if token is not None else None
        if session is not None:
            mine = self.tokens.get(session[0], {})
            mine.pop(str(token), None)
            if not mine:
                self.tokens.pop(session[0], None)

    async def principal_of(self, request: Request) -> str | None:
        """The principal `request` acts as: its Basic credentials (proven), else its session
        cookie; None when it carries neither or the session is over."""
        credential = _credential(request)
        if credential is not None:
            principal, password = credential
            key = (principal, hashlib.sha256(password.encode()).digest())
            proof = self.proofs.get(key)
            if proof is None or proof[0] < time.monotonic() or \
                    proof[1] != self.state.access.principal(principal):
                record = await self._prove(principal, password)
                self._forget_expired()
                self.proofs.pop(key, None)  # (put last: the order they expire)
                self.proofs[key] = (time.monotonic() + PROOF_S, record)
            return principal
        token = request.cookies.get(COOKIE, "")
        session = self.sessions.get(token)
        if session is None or session[1] < time.monotonic():
            return None
        if session[2] != self.state.access.principal(session[0]):  # (a new password ...)
            self.logout(token)
            return None
        return session[0]

    def still_holds(self, request: Request, principal: str | None) -> Callable[[], bool]:
        """A cheap check, made once `principal_of(request)` gave `principal`, that the login
        still holds (principal_of's rule): the session is still kept and not expired, or the
        Basic credential's principal has the record it had now. What outlives its request
        (a live tail) asks it again and again: a logout, a new password, other roles end it."""
        if principal is None:  # (`off` mode: nobody logged in, nothing to end)
            return lambda: True
        if _credential(request) is not None:
            record = self.state.access.principal(principal)
            return lambda: record is not None and self.state.access.principal(principal) == record
        token = request.cookies.get(COOKIE, "")

        def session_holds() -> bool:
            session = self.sessions.get(token)
            return session is not None and session[1] >= time.monotonic() and \
                session[2] == self.state.access.principal(session[0])
        return session_holds

    async def _prove(self, principal: str, password: str) -> Principal:
        """The principal's record under which Redis accepted `password` for its user; raises
        UnknownCaller unless `principal` is a principal of this service and Redis accepts it.

        The record is the one read before the AUTH, and still the same once Redis answered:
        a `principal passwd` that ran in between (Redis took the old password, then the new
        record came) must not leave a session or proof of the new record, made with the old
        password (it would outlive the rotation meant to end it)."""
        for field, text in (("principal", principal), ("password", password)):
            if not text or len(text.encode()) > MAX_FIELD_BYTES:
                raise InvalidRequest(f"{field}: must be 1 to {MAX_FIELD_BYTES} bytes",
                                     {"path": field, "limit": MAX_FIELD_BYTES})
        record = self.state.access.principal(principal)
        # Redis is asked for a name that is no principal too (and the answer dropped): the
        # refusal then takes as long as a wrong password's, and tells no name apart.
        accepted = await self._auth(principal, password)
        if record is None or not accepted or self.state.access.principal(principal) != record:
            raise UnknownCaller(f"principal {shown(principal)}: unknown, or the password is "
                                "wrong", {"principal": principal})
        return record

    async def _auth(self, principal: str, password: str) -> bool:
        """Whether Redis accepts `password` for the user `principal`: `AUTH` on the proof
        connection, kept open for every proof (a connection a proof would leave each login,
        wrong ones too, a socket in TIME_WAIT for a minute: a flood of them uses up the
        ports to Redis). Its own connection, as AUTH changes its user; any node of a
        cluster knows the users (the operator sets them on each: docs/security.md). Once
        more on a new connection when it is lost: removing a user, or `CLIENT KILL USER`,
        closes the connections of the user its last AUTH made it."""
        try:
            return await self._auth_once(principal, password)
        except ConnectionLost:
            try:
                return await self._auth_once(principal, password)
            except ConnectionLost as exc:
                raise UnknownCaller(f"could not check the password of {shown(principal)}: "
                                    f"{exc}", {"principal": principal}) from exc

    async def _auth_once(self, principal: str, password: str) -> bool:
        if self.proof_conn is None:
            self.proof_conn = connection_for(
                seeds_of(self.state.conn.url)[0],
                connect_timeout_s=self.state.conn.connect_timeout_s,
                read_timeout_s=self.state.conn.read_timeout_s)
        try:
            await self.proof_conn.execute("AUTH", principal, password)
        except ReplyError as exc:
            if "WRONGPASS" in str(exc) or "NOPERM" in str(exc):
                return False
            raise
        return True

    async def close(self) -> None:
        """Close the proof connection (the HTTP face stops)."""
        if self.proof_conn is not None:
            await self.proof_conn.close()

    def _forget_expired(self) -> None:
        now = time.monotonic()
        while self.sessions:
            token, session = next(iter(self.sessions.items()))
            if session[1] >= now:
                break
            self.logout(token)
        while self.proofs:
            key, proof = next(iter(self.proofs.items()))
            if proof[0] >= now:
                break
            del self.proofs[key]


def _credential(request: Request) -> tuple[str, str] | None:
    """(principal, password) a request carries: `Authorization: Basic`, else Dapr's
    `dapr-api-token: <principal>:<password>` (what Dapr's SDKs send from DAPR_API_TOKEN)."""
    header = request.headers.get("authorization")
    if header is not None:
        return _basic(header)
    token = request.headers.get("dapr-api-token")
    if token is None:
        return None
    principal, sep, password = token.partition(":")
    if not sep:
        raise InvalidRequest("dapr-api-token: must be `<principal>:<password>`",
                             {"path": "dapr-api-token"})
    return principal, password


def _basic(header: str) -> tuple[str, str]:
    """(principal, password) of an `Authorization: Basic ...` header."""
    scheme, _, encoded = header.partition(" ")
    try:
        if scheme.lower() != "basic":
            raise ValueError(scheme)
        principal, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        if not sep:
            raise ValueError("no colon")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("Authorization: must be `Basic <base64 of principal:password>`",
                             {"path": "Authorization"}) from None
    return principal, password


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class SameOrigin:
    """ASGI middleware: refuses (403, PERMISSION_DENIED) a request that may change something
    and comes from a page of another origin (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            refusal = origin_refusal(dict(scope["headers"]))
            if refusal is not None:
                await send_refusal(send, refusal)
                return
        await self.app(scope, receive, send)


def origin_refusal(headers: dict[bytes, bytes]) -> PermissionDenied | None:
    """Why a request that may change something, with `headers` (the last of a repeated
    one), is refused: it comes from a page of another origin."""
    origin = headers.get(b"origin")
    if origin is None or _same(origin, headers.get(b"host")):
        return None
    shown_origin = origin.decode(errors="replace")
    return PermissionDenied(
        f"Origin {shown(shown_origin)}: a page of another site may not call this service "
        "(programs send no Origin header)", {"path": "Origin", "value": shown_origin})


def _same(origin: bytes, host: bytes | None) -> bool:
    """Whether a browser's `Origin` names the address the request was sent to. Its host and
    port, not its scheme: behind a TLS proxy the page is https and the service http (the
    proxy must pass `Host` on)."""
    try:
        parsed = urllib.parse.urlsplit(origin.decode(errors="replace"))
    except ValueError:  # (no URL, `http://[::1`: not the service's own; it was a 500)
        return False
    return host is not None and parsed.scheme in ("http", "https") and \
        parsed.netloc.encode() == host
