"""Who an HTTP request acts as in `acl` mode: a principal, proven by its Redis password.

Redis keeps the passwords (a principal's ACL user, docs/security.md), so the service never
stores one: a login sends `AUTH <principal> <password>` on a connection of its own to the
service's Redis, kept for every proof; Redis's OK is the proof, WRONGPASS the refusal (asked
for a name that is no principal too: a refusal's timing names none). Two ways in:

- the console's login form (`POST /v1/console/login`): a session, a random token in an
  HttpOnly, SameSite=Strict cookie, kept in Redis for `SESSION_S` (`session.lua`: the key is
  the token's SHA-256, so what Redis holds opens no session), so every replica knows every
  session and a `Log out` at one ends it at all; at most `SESSIONS_PER_PRINCIPAL` a principal
  (a new login ends its oldest), so logging in again and again fills no memory (only
  principals log in: the operator makes them); a wiped Redis ends them all;
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
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from stateworker.app.hosts import send_refusal
from stateworker.clock import now_ms
from stateworker.errors import (
    InvalidRequest,
    PermissionDenied,
    Unavailable,
    UnknownCaller,
    shown,
)
from stateworker.scripts.upkeep_bindings import SESSION, session_call
from stateworker.state.core.grants import Principal
from stateworker.state.core.store import RedisState
from stateworker.transport.cluster_map import seeds_of
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ConnectionLost, ReplyError

COOKIE = "sw_session"
SESSION_S = 12 * 3600.0  # a console login lasts this long
PROOF_S = 60.0  # a Basic credential proven is trusted this long before Redis is asked again
MAX_FIELD_BYTES = 256  # a principal's name or password, as sent
SESSIONS_PER_PRINCIPAL = 16  # a principal's sessions at most: a new login ends its oldest
# A live tail asks Redis again whether its session still holds at most this often (a logout
# at any replica ends it within this, its next bookmark or event).
SESSION_RECHECK_S = 1.0


class Logins:
    """The console's sessions (in Redis) and the Basic credentials one process proved."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        # (principal, sha256) -> (expires, its record then): a proof ends when the record
        # changes (a new password, other roles: `rotated_ms`, grants.Principal), on every
        # replica within a moment (the registry follower reloads the records). In the order
        # they expire (each lives as long; one renewed is put last), so the expired ones are
        # found at the front, not by a pass over all.
        self.proofs: dict[tuple[str, bytes], tuple[float, Principal | None]] = {}
        self.proof_conn: RedisConnection | None = None  # (_auth's)
        self.logouts = 0  # made at this replica: its tails ask Redis again at once

    @property
    def required(self) -> bool:
        return self.state.settings.auth == "acl"

    async def login(self, principal: str, password: str) -> str:
        """A new session's token for `principal` once Redis accepts its password."""
        record = await self._prove(principal, password)
        token = secrets.token_urlsafe(32)
        ends_ms = now_ms() + int(SESSION_S * 1000)
        await self._session(token, principal, _session_record(principal, record, ends_ms),
                            ends_ms)
        return token

    async def logout(self, token: str | None) -> None:
        """End the session of `token` (at every replica: it is Redis's)."""
        session = await self._session_of(token) if token else None
        if session is not None and token is not None:
            await self._session(token, session[0], None)
            self.logouts += 1

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
                proof = self.proofs[key] = (time.monotonic() + PROOF_S, record)
            request.state.proven_under = proof[1]  # (still_holds')
            return principal
        token = request.cookies.get(COOKIE, "")
        session = await self._session_of(token) if token else None
        if session is None:
            return None
        principal, record = session
        if record != self.state.access.principal(principal):  # (a new password ...)
            await self._session(token, principal, None)
            return None
        request.state.proven_under = record  # (still_holds')
        return principal

    def still_holds(self, request: Request, principal: str | None
                    ) -> Callable[[], Awaitable[bool]]:
        """A check, made once `principal_of(request)` gave `principal`, that the login still
        holds (principal_of's rule): the Basic credential's principal, or the session's, has
        the record principal_of proved it under, and the session is still in Redis (asked again at most every
        SESSION_RECHECK_S, and at once after a logout at this replica). What outlives its
        request (a live tail) asks it again and again: a logout at any replica, a new
        password, other roles end it."""
        if principal is None:  # (`off` mode: nobody logged in, nothing to end)
            return _holding
        # The record principal_of proved the login under, not the one known now: a tail
        # opened with an old password while `principal passwd` ran (its watch opening, an
        # await) took the new record and held for good.
        record: Principal | None = request.state.proven_under
        if _credential(request) is not None:
            async def proof_holds() -> bool:
                return record is not None and self.state.access.principal(principal) == record
            return proof_holds
        token = request.cookies.get(COOKIE, "")
        asked, logouts = time.monotonic(), self.logouts  # (principal_of has just read it)

        async def session_holds() -> bool:
            nonlocal asked, logouts
            if record is None or self.state.access.principal(principal) != record:
                return False
            if time.monotonic() - asked < SESSION_RECHECK_S and logouts == self.logouts:
                return True
            asked, logouts = time.monotonic(), self.logouts
            return await self._session_of(token) == (principal, record)
        return session_holds

    def still_proven(self, request: Request, principal: str) -> None:
        """Raises UnknownCaller when the record `principal_of(request)` proved `principal`
        under is no longer its own (a new password, other roles, removed): a call whose
        body came after a `principal passwd` ran nothing (a body may take 60 s, and a
        leaked password's holder could send heads before the rotation, bodies after)."""
        if self.state.access.principal(principal) != request.state.proven_under:
            raise UnknownCaller(
                f"principal {shown(principal)}: its record changed (a new password, other "
                "roles, or removed) after this request was proven and before its body came; "
                "nothing was run: send it again with the principal's credentials",
                {"principal": principal, "path": "authorization"})

    async def _session_of(self, token: str) -> tuple[str, Principal] | None:
        """(principal, its record at the login) of the session `token`; None when there is
        none (never was, ended, or past its end: Redis expires it then, and the end is in
        the record too, so a key whose expiry was removed (PERSIST) ends all the same)."""
        try:
            stored = await self.state.conn.execute("GET", self.state.keys.session(_digest(token)))
        except OSError as exc:  # (ConnectionLost and timeouts are OSErrors)
            raise Unavailable(f"console session: Redis did not answer ({exc})",
                              {"path": COOKIE}) from exc
        if stored is None:
            return None
        try:
            principal, record, ends_ms = _session_decoder.decode(stored)
        except msgspec.ValidationError:  # (written by an older service: over)
            return None
        return (principal, record) if ends_ms > now_ms() else None

    async def _session(self, token: str, principal: str, stored: bytes | None,
                       ends_ms: int = 0) -> None:
        """Open the session `token` of `principal` as `stored` says until `ends_ms`, or close
        it (None)."""
        call = session_call(self.state.keys, _digest(token), principal, stored, ends_ms,
                            SESSIONS_PER_PRINCIPAL)
        try:
            (reply,) = await pipeline(self.state.conn, self.state.library,
                                      [SESSION.command(self.state.library, *call)])
        except OSError as exc:
            raise Unavailable(f"console session: Redis did not answer ({exc})",
                              {"path": COOKIE}) from exc
        SESSION.read(reply)

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
            except ConnectionLost as exc:  # (Redis's trouble, not the caller's: 503)
                raise Unavailable(f"could not check the password of {shown(principal)}: "
                                  f"{exc}", {"principal": principal}) from exc

    async def open(self) -> None:
        """Connect the proof connection now (`acl` mode), before any login needs it: made at
        a first login, it could find Redis's `maxclients` taken by then (a principal may
        open connections up to it: docs/security.md), and no login would be proven."""
        if self.required:
            await self._proof_conn().try_connect()  # (not there: the first login connects)

    def _proof_conn(self) -> RedisConnection:
        if self.proof_conn is None:
            self.proof_conn = connection_for(
                seeds_of(self.state.conn.url)[0],
                connect_timeout_s=self.state.conn.connect_timeout_s,
                read_timeout_s=self.state.conn.read_timeout_s)
        return self.proof_conn

    async def _auth_once(self, principal: str, password: str) -> bool:
        try:
            await self._proof_conn().execute("AUTH", principal, password)
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
        while self.proofs:
            key, proof = next(iter(self.proofs.items()))
            if proof[0] >= now:
                break
            del self.proofs[key]


_session_decoder = msgspec.json.Decoder(tuple[str, Principal, int])


def _session_record(principal: str, record: Principal, ends_ms: int) -> bytes:
    """What Redis keeps of a session: its principal, the record it logged in under, and
    when it ends (epoch ms, Redis's clock)."""
    return msgspec.json.encode((principal, record, ends_ms))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode(errors="surrogateescape")).hexdigest()


async def _holding() -> bool:
    return True


def _credential(request: Request) -> tuple[str, str] | None:
    """(principal, password) a request carries: `Authorization: Basic`, else Dapr's
    `dapr-api-token: <principal>:<password>` (what Dapr's SDKs send from DAPR_API_TOKEN)."""
    header = request.headers.get("authorization")
    if header is not None:
        return _basic(header)
    sent = request.headers.get("dapr-api-token")
    if sent is None:
        return None
    # Its bytes as UTF-8, as Basic's (base64 of UTF-8) and a login form's: Starlette reads a
    # header as latin-1, which made a password beyond ASCII another one (proven at every
    # other door, refused at Dapr's). (Its bytes are not shown: they hold a password.)
    try:
        token = sent.encode("latin-1").decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"dapr-api-token: not valid UTF-8 text (byte {exc.start} of it)",
                             {"path": "dapr-api-token"}) from None
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
HELD_PATHS = frozenset({"/v1/console/tail"})  # safe methods that hold a shared slot open


class SameOrigin:
    """ASGI middleware: refuses (403, PERMISSION_DENIED) a request that may change something
    and comes from a page of another origin (module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A live tail is a GET that holds one of a few slots per client address while it is
        # open: another site's page (its EventSources come from the user's own address) could
        # take them all and leave the console's own tail refused. A browser sends `Origin`
        # with a cross-origin EventSource, so a foreign one is refused there too.
        if scope["type"] == "http" and (scope["method"] not in SAFE_METHODS
                                        or scope["path"] in HELD_PATHS):
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
