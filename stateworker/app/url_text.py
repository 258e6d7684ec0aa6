"""The HTTP face's guard on a URL's %-escapes: a request whose path or query string has
%-escapes that do not decode to UTF-8 is refused (400, INVALID_REQUEST) before routing,
naming the path or the query parameter.

Why: the server decodes a path's escapes as UTF-8 with U+FFFD for each byte that is not
(`%FE` and `%FF` alike), and Starlette a query string's likewise. A name taken from the URL
(a function, a Dapr store or key, a console `scope`, `key` or `prefix`, a Dapr `metadata.*`)
would then be one the caller did not send, the same for many byte strings: `?scope=%FF`
read the scope U+FFFD, another caller's, and grants are checked on the name decoded. Bytes
beyond ASCII sent unescaped never get here: the server's parser refuses them itself (400).

Where it runs: `url_refusal` is asked by `UrlText`, a middleware after the Host and Origin
guards (app/http.py), and by hot_paths.CallDoor for the call API's requests (which it answers
in front of the app), as the Host guard is asked by both. A path or query string without a
`%` costs one look for it (the call API's `POST /v1/call/state::set` has none).

Each door answers in its own shape: Dapr's paths (`/v1.0/...`, `/v1.0-alpha1/...`) Dapr's
`{"errorCode": "ERR_MALFORMED_REQUEST", "message", "details"}` (its SDKs read `errorCode`;
our code is in its ErrorInfo's `reason`), as Dapr's routes answer any refusal; every other
path (the call API, the console's reads, /metrics) the call API's error document, as the
Host and Origin guards answer them (the console reads its `error` as its own routes' errors).
"""

from __future__ import annotations

from urllib.parse import unquote, unquote_to_bytes

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from stateworker.app.dapr import DOORS as DAPR_DOORS
from stateworker.app.dapr_requests import failed
from stateworker.app.hosts import send_refusal
from stateworker.errors import InvalidRequest, shown

_PERCENT = ord("%")  # (an int: `in` on bytes looks for it ~10x faster than for b"%")
_HOW = ("each byte of a character beyond ASCII is sent as its own %XX (é as %C3%A9); nothing "
        "was run")


def url_refusal(scope: Scope) -> InvalidRequest | None:
    """Why the request of ASGI `scope` is refused: its path's or a query parameter's
    %-escapes do not decode to UTF-8 (module docstring); None when they all do."""
    raw_path: bytes = scope.get("raw_path") or b""
    if _PERCENT in raw_path:
        fault = _not_utf8(raw_path)
        if fault is not None:
            return InvalidRequest(f"path: its %-escapes must decode to UTF-8 text, and {fault}; "
                                  f"{_HOW}", {"path": "path"})
    query: bytes = scope.get("query_string") or b""
    if _PERCENT in query:
        for pair in query.split(b"&"):  # (Starlette's query_params split on & alone)
            sent, _, value = pair.partition(b"=")
            name = None if _not_utf8(sent) else unquote(sent.decode("latin-1").replace("+", " "))
            for part, which in ((sent, "name"), (value, "value")):
                fault = _not_utf8(part)
                if fault is not None:
                    where = (f"query parameter {shown(name)}" if name is not None else
                             f"a query parameter's name (sent as {shown(sent.decode('latin-1'))})")
                    return InvalidRequest(f"{where}: its {which}'s %-escapes must decode to "
                                          f"UTF-8 text, and {fault}; {_HOW}",
                                          {"path": "query" if name is None else name})
    return None


def _not_utf8(escaped: bytes) -> str | None:
    """What in `escaped` (a URL's ASCII text, %-escaped) decoded is not UTF-8 (`byte 3 of
    it decoded is 0xFF`); None when it all is."""
    if _PERCENT not in escaped:
        return None
    decoded = unquote_to_bytes(escaped)
    try:
        decoded.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"byte {exc.start} of it decoded is 0x{decoded[exc.start]:02X}"
    return None


class UrlText:
    """ASGI middleware: refuses a request `url_refusal` names, in its door's shape (module
    docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = url_refusal(scope)
            if refusal is not None:
                if str(scope["path"]).startswith(DAPR_DOORS):
                    error = failed("ERR_MALFORMED_REQUEST", refusal, "the request")
                    await Response(error.body(), error.status, media_type="application/json"
                                   )(scope, receive, send)
                else:
                    await send_refusal(send, refusal)
                return
        await self.app(scope, receive, send)
