"""A request's body, read within a limit: the HTTP face's one reader (the call API, Dapr's
routes, the console's login form)."""

from __future__ import annotations

from starlette.types import Receive

from stateworker.errors import InvalidRequest, ValueTooLarge


async def read_body(receive: Receive, limit: int, what: str = "body") -> bytes:
    """The body of the request whose ASGI `receive` this is (read once: a Starlette route
    passes `request.receive`); VALUE_TOO_LARGE past `limit` bytes, naming `what` (what is
    past the limit is read and dropped, never kept: a reply sent while the client still
    uploads would reach it as a reset); INVALID_REQUEST when the connection ended before the
    body did (the client went away, or stalled: app/http_server.py's body timeout)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # ("http.disconnect")
            raise InvalidRequest(f"{what}: the connection ended after {size} bytes, before "
                                 "the body did", {"path": "body", "size": size})
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if size > limit:
        raise ValueTooLarge(f"{what} is {size} bytes, more than the limit of {limit} bytes",
                            {"path": "body", "size": size, "limit": limit})
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
