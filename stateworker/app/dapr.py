"""Dapr's state API shape on the HTTP face (app/http.py), so a Dapr client or SDK can point at
stateworker: a store is a scope, a key a key, an ETag an entry's version (its decimal text).

    POST   /v1.0/state/{store}                 save items (one transaction: all or none)
    GET    /v1.0/state/{store}/{key}           the value, `ETag` header; 204 when absent
    DELETE /v1.0/state/{store}/{key}           `If-Match: <etag>`: only at that version
    POST   /v1.0/state/{store}/bulk            `{"keys": [...]}` -> [{key, data, etag}]
    POST   /v1.0/state/{store}/transaction     upsert and delete operations, atomically
    POST   /v1.0-alpha1/state/{store}/query    EQ, IN and AND filters, a page and its token

Each runs native functions through `Caller` (the HTTP face's in-process call), so it is
what a bus call would do. A save or transaction whose ETag does not hold is 409 and writes
nothing; errors come as Dapr's `{"errorCode", "message"}` with the code's HTTP status.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stateworker.errors import InvalidRequest, StateError, http_status

Caller = Callable[[str, bytes], Awaitable[bytes]]  # (function, JSON body) -> result JSON
Reader = Callable[[Request], Awaitable[bytes]]  # a request's body, refused past the limit
Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"


class Item(msgspec.Struct):
    key: str
    value: msgspec.Raw = msgspec.Raw(b"null")
    etag: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class Operation(msgspec.Struct):
    operation: str  # upsert | delete
    request: Item


class Transaction(msgspec.Struct):
    operations: list[Operation]


class Bulk(msgspec.Struct):
    keys: list[str]


class Entry(msgspec.Struct):
    """What the functions' results say of an entry (the value kept as its JSON text)."""

    found: bool = True
    key: str = ""
    value: msgspec.Raw = msgspec.Raw(b"null")
    version: int | None = None


class Entries(msgspec.Struct):
    entries: list[Entry]
    next_after: str | None = None


class Page(msgspec.Struct):
    limit: int = 100
    token: str | None = None


class Query(msgspec.Struct):
    filter: dict[str, Any] = msgspec.field(default_factory=dict)
    sort: list[Any] = msgspec.field(default_factory=list)
    page: Page = msgspec.field(default_factory=Page)


def dapr_routes(call: Caller, read: Reader) -> list[Route]:
    """The Dapr state routes, each calling native functions through `call`, reading its
    body with `read` (the HTTP face's size limit)."""
    async def save(request: Request) -> Response:
        items = _decode(await read(request), list[Item], "body")
        ops = [_upsert(item, f"$[{i}]") for i, item in enumerate(items)]
        await call("state::transaction", _json({"scope": _store(request), "ops": ops}))
        return Response(status_code=204)

    async def get(request: Request) -> Response:
        entry = msgspec.json.decode(await call("state::get-entry", _json(_address(request))),
                                    type=Entry)
        if not entry.found:
            return Response(status_code=204)
        return Response(bytes(entry.value), 200, media_type=JSON,
                        headers={"ETag": str(entry.version)})

    async def delete(request: Request) -> Response:
        etag = request.headers.get("if-match")
        body = {**_address(request), **_version(etag, "If-Match")}
        await call("state::delete", _json(body))
        return Response(status_code=204)

    async def bulk(request: Request) -> Response:
        keys = _decode(await read(request), Bulk, "body").keys
        got = msgspec.json.decode(await call("state::get-many", _json(
            {"scope": _store(request), "keys": keys})), type=Entries)
        items = [{"key": key, "data": entry.value, "etag": str(entry.version)}
                 if entry.found else {"key": key}
                 for key, entry in zip(keys, got.entries, strict=True)]
        return Response(msgspec.json.encode(items), 200, media_type=JSON)

    async def transaction(request: Request) -> Response:
        operations = _decode(await read(request), Transaction, "body").operations
        ops = [_operation(op, f"$.operations[{i}]") for i, op in enumerate(operations)]
        await call("state::transaction", _json({"scope": _store(request), "ops": ops}))
        return Response(status_code=204)

    async def query(request: Request) -> Response:
        asked = _decode(await read(request), Query, "body")
        if asked.sort:
            raise InvalidRequest("$.sort: not supported: results come in key order",
                                 {"path": "$.sort"})
        body: dict[str, Any] = {"scope": _store(request), "where": _where(asked.filter),
                                "limit": asked.page.limit}
        if asked.page.token:
            body["after"] = asked.page.token
        found = msgspec.json.decode(await call("state::query", _json(body)), type=Entries)
        out: dict[str, Any] = {"results": [
            {"key": e.key, "data": e.value, "etag": str(e.version)} for e in found.entries]}
        if found.next_after is not None:
            out["token"] = found.next_after
        return Response(msgspec.json.encode(out), 200, media_type=JSON)

    return [
        Route("/v1.0/state/{store}", _dapr(save), methods=["POST"]),
        Route("/v1.0/state/{store}/bulk", _dapr(bulk), methods=["POST"]),
        Route("/v1.0/state/{store}/transaction", _dapr(transaction), methods=["POST"]),
        Route("/v1.0-alpha1/state/{store}/query", _dapr(query), methods=["POST"]),
        Route("/v1.0/state/{store}/{key:path}", _dapr(get), methods=["GET"]),
        Route("/v1.0/state/{store}/{key:path}", _dapr(delete), methods=["DELETE"]),
    ]


def _dapr(handler: Handler) -> Handler:
    """`handler` with its StateError as Dapr's error body and the code's HTTP status."""
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except StateError as exc:
            body = {"errorCode": exc.code, "message": exc.message, "details": exc.details}
            return Response(msgspec.json.encode(body), http_status(exc.code), media_type=JSON)

    return answered


def _json(value: Any) -> bytes:
    return msgspec.json.encode(value)


def _decode(body: bytes, type_: Any, where: str) -> Any:
    try:
        return msgspec.json.decode(body, type=type_)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"{where}: {exc}", {"path": where}) from exc


def _store(request: Request) -> str:
    return str(request.path_params["store"])


def _address(request: Request) -> dict[str, str]:
    return {"scope": _store(request), "key": str(request.path_params["key"])}


def _version(etag: str | None, where: str) -> dict[str, int]:
    """`expected_version` for an ETag (none: no condition)."""
    if etag is None or etag == "":
        return {}
    text = etag.strip('"')
    if not text.isdigit() or not 1 <= int(text) <= 2**53:
        raise InvalidRequest(f"{where}: an ETag is an entry's version (a positive integer, as "
                             f"GET's ETag header gives it), got {etag!r}", {"path": where})
    return {"expected_version": int(text)}


def _upsert(item: Item, where: str) -> dict[str, Any]:
    op: dict[str, Any] = {"op": "set", "key": item.key, "value": item.value,
                          **_version(item.etag, f"{where}.etag")}
    ttl = item.metadata.get("ttlInSeconds")
    if ttl is not None and ttl != "-1":  # (-1: Dapr's "never expire", as no ttl)
        if not ttl.isdigit():
            raise InvalidRequest(f"{where}.metadata.ttlInSeconds: a whole number of seconds, "
                                 f"got {ttl!r}", {"path": f"{where}.metadata.ttlInSeconds"})
        op["ttl_ms"] = int(ttl) * 1000
    return op


def _operation(operation: Operation, where: str) -> dict[str, Any]:
    if operation.operation == "upsert":
        return _upsert(operation.request, f"{where}.request")
    if operation.operation == "delete":
        return {"op": "delete", "key": operation.request.key,
                **_version(operation.request.etag, f"{where}.request.etag")}
    raise InvalidRequest(f"{where}.operation: must be upsert or delete, got "
                         f"{operation.operation!r}", {"path": f"{where}.operation"})


def _where(node: Any, where: str = "$.filter") -> list[dict[str, Any]]:
    """Dapr's filter as the query's `where` list: EQ and IN on a dotted path, AND of them."""
    if not isinstance(node, dict):
        raise InvalidRequest(f"{where}: must be an object (EQ, IN or AND)", {"path": where})
    if not node:
        return [{"pointer": "", "op": "exists", "value": True}]
    if len(node) != 1:
        raise InvalidRequest(f"{where}: one of EQ, IN, AND per object", {"path": where})
    (kind, arg), = node.items()
    if kind == "AND" and isinstance(arg, list):
        return [w for i, part in enumerate(arg) for w in _where(part, f"{where}.AND[{i}]")]
    if kind in ("EQ", "IN") and isinstance(arg, dict) and len(arg) == 1:
        (path, value), = arg.items()
        pointer = "/" + "/".join(p.replace("~", "~0").replace("/", "~1")
                                 for p in str(path).split("."))
        return [{"pointer": pointer, "op": kind.lower(), "value": value}]
    raise InvalidRequest(f"{where}: {kind!r} is not supported here: EQ and IN (one path "
                         "each) and AND of them are", {"path": where})
