"""The names the HTTP face answers to: a request whose `Host` names another is refused before
routing (403, PERMISSION_DENIED), whatever its method and credentials.

Why: the same-origin guard (logins.SameOrigin) compares a page's `Origin` with `Host`, and
a DNS-rebinding page makes both its own name (a name of the attacker's that resolves to this
service's address), so only a list of this service's own names tells it apart. The list is
`STATEWORKER_HTTP_HOSTS` (host names or addresses, comma-separated; `*`: any), else the
loopback names and the bind address's host (a bind to every address, 0.0.0.0 or [::],
names none: set the list, as compose.yaml does)."""

from __future__ import annotations

import ipaddress
from typing import Any

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from stateworker.error_codes import http_status
from stateworker.errors import PermissionDenied, StateError, shown
from stateworker.settings import Settings

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_EVERY_ADDRESS = frozenset({"0.0.0.0", "::", ""})


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The names the HTTP face answers to (lower case, no port); None: any."""
    if settings.http_hosts is not None:
        names = {name.strip().lower().strip("[]") for name in settings.http_hosts.split(",")}
        return None if "*" in names else frozenset(names - {""})
    bound = host_of((settings.http or "").encode())
    return LOOPBACK | ({bound} - _EVERY_ADDRESS if bound else set())


def local_only(settings: Settings) -> bool:
    """Whether only this machine's own programs reach the HTTP face: it listens on a loopback
    address (127.0.0.0/8, ::1, localhost) and answers to loopback names alone. A bind to
    loopback is not enough: a reverse proxy on the same machine passes the network's requests
    on, under the public name STATEWORKER_HTTP_HOSTS then lists."""
    hosts = allowed_hosts(settings)
    return _loopback(host_of((settings.http or "").encode())) and hosts is not None and \
        all(_loopback(name) for name in hosts)


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def host_of(header: bytes | None) -> str | None:
    """The host of a `Host` header (or a bind address): no port, no brackets, lower case."""
    if not header:
        return None
    text = header.decode(errors="replace").strip().lower()
    if text.startswith("["):  # [v6]:port
        return text[1:text.find("]")] if "]" in text else None
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class HostGuard:
    """ASGI middleware: refuses a request for a host this service does not answer to."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.hosts is not None:
            refusal = host_refusal(self.hosts, dict(scope["headers"]))
            if refusal is not None:
                await send_refusal(send, refusal)
                return
        await self.app(scope, receive, send)


def host_refusal(hosts: frozenset[str] | None, headers: dict[bytes, bytes]
                 ) -> PermissionDenied | None:
    """Why a request with `headers` (the last of a repeated one) is refused: its `Host` is
    none of `hosts` (None: any host is answered)."""
    if hosts is None:
        return None
    host = host_of(headers.get(b"host"))
    if host in hosts:
        return None
    return PermissionDenied(
        f"Host {shown(host)}: this service answers to {', '.join(sorted(hosts))} only "
        "(STATEWORKER_HTTP_HOSTS: a page under a name of another's that resolves to this "
        "address must not reach it, DNS rebinding); nothing was run",
        {"path": "Host", "value": host, "hosts": sorted(hosts)})


async def send_refusal(send: Send, error: StateError) -> None:
    """A guard's refusal, before routing: the call API's error document, with its code's
    status (403 for the Host and Origin guards, 400 for url_text's)."""
    body = msgspec.json.encode({"id": None, "ok": False, "error": {
        "code": error.code, "message": str(error), "details": error.details}})
    start: dict[str, Any] = {"type": "http.response.start", "status": http_status(error.code),
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode())]}
    await send(start)
    await send({"type": "http.response.body", "body": body})
