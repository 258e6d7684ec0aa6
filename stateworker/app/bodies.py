"""A request's body, read within a limit: the HTTP face's one reader (the call API, Dapr's
routes, the console's login form)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from stateworker.errors import InvalidRequest, ValueTooLarge


async def read_body(request: Request, limit: int, what: str = "body") -> bytes:
    """The request's body; VALUE_TOO_LARGE past `limit` bytes, naming `what` (what is past
    the limit is read and dropped, never kept: a reply sent while the client still uploads
    would reach it as a reset); INVALID_REQUEST when the connection ended before the body
    did (the client went away, or stalled: app/http_server.py's body timeout)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
    except ClientDisconnect:
        raise InvalidRequest(f"{what}: the connection ended after {size} bytes, before the "
                             "body did", {"path": "body", "size": size}) from None
    if size > limit:
        raise ValueTooLarge(f"{what} is {size} bytes, more than the limit of {limit} bytes",
                            {"path": "body", "size": size, "limit": limit})
    return b"".join(chunks)
