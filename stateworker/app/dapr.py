"""Dapr's state API on the HTTP face (app/http.py), as Dapr's HTTP API reference gives it, so
Dapr's SDKs (over HTTP) and clients point at stateworker unchanged: a store is a configured
scope (app/dapr_requests.py), a key a key, an ETag an entry's version.

    GET         /v1.0/healthz, /v1.0/healthz/outbound   204 (the SDKs wait on these)
    GET         /v1.0/metadata                          the app and its state stores
    POST|PUT    /v1.0/state/{store}                     save items (one transaction: all or none)
    GET         /v1.0/state/{store}/{key}               the value, `ETag` header (and
                                                        `metadata.ttlExpireTime`); 204 absent
    DELETE      /v1.0/state/{store}/{key}               `If-Match: <etag>`: only at that version
    POST|PUT    /v1.0/state/{store}/bulk                `{"keys": [...]}` -> [{key, data, etag,
                                                        metadata: {ttlExpireTime}}]
    POST|PUT    /v1.0/state/{store}/transaction         operations in order, all or nothing
    POST|PUT    /v1.0-alpha1/state/{store}/query        app/dapr_query.py

Each runs native functions through `Caller` (the HTTP face's in-process call, as the
request's principal in `acl` mode: `dapr-api-token` or `Authorization`), so it is what a bus
call would do. Errors are Dapr's: `{"errorCode", "message", "details"}` with Dapr's statuses
(an ETag that does not hold 409, a malformed request 400, a store that is not there 400),
naming the Dapr request's fields, not the native calls' (app/dapr_fields.py). An item that
expires says when (`ttlExpireTime`, RFC 3339 in UTC to the second, as Dapr's stores write it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stateworker import __name__ as _package
from stateworker.app import dapr_query
from stateworker.app.dapr_fields import Fields, renamed
from stateworker.app.dapr_requests import (
    CAPABILITIES,
    Bulk,
    DaprError,
    Item,
    Layer,
    Store,
    Transaction,
    decode,
    expected,
    failed,
    in_order,
    malformed,
    repeated_with_etag,
    upsert,
    url_metadata,
    url_options,
)
from stateworker.clock import rfc3339_s
from stateworker.errors import InvalidRequest, StateError, shown
from stateworker.state.kv.bulkread import MAX_GET_MANY, keys_too_large

# (request, function, JSON body) -> the result's JSON, as the request's principal
Caller = Callable[[Request, str, bytes], Awaitable[bytes]]
Reader = Callable[[Request], Awaitable[bytes]]  # a request's body, refused past the limit
Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"
WRITES = ["POST", "PUT"]  # Dapr takes either for its writes and queries
DOORS = ("/v1.0/", "/v1.0-alpha1/")  # the paths Dapr's routes take: errors in Dapr's shape


class Entries(msgspec.Struct):
    entries: list[dapr_query.Entry]


def dapr_routes(call: Caller, read: Reader, stores: dict[str, Store], app_id: str,
                version: str, max_call_bytes: int) -> list[Route]:
    """The Dapr routes over the configured `stores`, each calling native functions through
    `call`, reading its body with `read` (the HTTP face's size limit); a bulk get or a
    query answers (and gathers) at most `max_call_bytes` of values, as one native call."""

    def store_of(request: Request) -> Store:
        name = str(request.path_params["store"])
        store = stores.get(name)
        if store is None:
            raise DaprError("ERR_STATE_STORE_NOT_FOUND", 400, f"state store {shown(name)} is "
                            f"not found (configured: {', '.join(sorted(stores)) or 'none'}; "
                            "STATEWORKER_DAPR_STORES)")
        return store

    async def native(request: Request, code: str, what: str, fn: str, body: Any,
                     fields: Fields) -> bytes:
        """Native `fn` on `body`; a refusal names the Dapr fields it came from (`fields`)."""
        try:
            return await call(request, fn, msgspec.json.encode(body))
        except StateError as exc:
            raise failed(code, renamed(exc, fields), what) from exc

    async def write(request: Request, store: Store, code: str, what: str, kind: str,
                    ops: list[dict[str, Any]], body: str) -> None:
        """`ops` (each naming its scope and its Dapr field: `upsert`) applied in order as
        one native transaction, all or nothing: a key written more than once ends as its
        last operation says, as Dapr applies a save's items and a transaction's operations
        one after the other (native calls write each key once). `body`: the Dapr field
        holding them all."""
        scope = _one_scope(ops, kind)
        versions: dict[str, int | None] = {}
        reread = repeated_with_etag(ops)
        fields = _write_fields(store, ops, body, reread)
        if reread:
            got = msgspec.json.decode(await native(
                request, code, what, "state::get-many", {"scope": scope, "keys": reread},
                fields), type=Entries)
            versions = {k: e.version for k, e in zip(reread, got.entries, strict=True)}
        await native(request, code, what, "state::transaction",
                     {"scope": scope, "ops": in_order(_keys(ops), versions, code)}, fields)

    async def save(request: Request) -> Response:
        store = store_of(request)
        items = decode(await read(request), list[Item] | None)  # (null: none, as Dapr)
        if not items:
            return Response(status_code=204)
        url = url_metadata(request.query_params)
        ops = []
        for i, item in enumerate(items):
            scope, key = store.address(item.key, f"$[{i}].key")
            ops.append({**upsert(item, key, f"$[{i}]", "ERR_STATE_SAVE", url), "scope": scope})
        await write(request, store, "ERR_STATE_SAVE", f"failed saving state in state store "
                    f"{store.name}", "a save", ops, "$")
        return Response(status_code=204)

    async def get(request: Request) -> Response:
        store = store_of(request)
        key = str(request.path_params["key"])  # (its escapes are UTF-8: app/url_text.py)
        scope, native_key = store.address(key, "key")
        url_options(request.query_params, ("consistency",))
        got = msgspec.json.decode(await native(
            request, "ERR_STATE_GET", f"fail to get {key} from state store {store.name}",
            "state::get-entry", {"scope": scope, "key": native_key},
            _read_fields(store, "key", key="key")), type=_Found)
        if not got.found:
            return Response(status_code=204)
        headers = {"ETag": str(got.version)}
        if got.expires_at is not None:  # Dapr's `ttlExpireTime`: its stores' RFC 3339 to
            # the second, in UTC; the get's metadata in headers `metadata.<name>`, as Dapr's
            headers["metadata.ttlExpireTime"] = rfc3339_s(got.expires_at)
        return Response(bytes(got.value), 200, media_type=JSON, headers=headers)

    async def delete(request: Request) -> Response:
        store = store_of(request)
        key = str(request.path_params["key"])  # (its escapes are UTF-8: app/url_text.py)
        scope, native_key = store.address(key, "key")
        url_options(request.query_params, ("concurrency", "consistency"))
        condition = expected(request.headers.get("if-match"), "If-Match", "ERR_STATE_DELETE")
        await native(request, "ERR_STATE_DELETE", f"failed deleting state with key {key}",
                     "state::delete", {"scope": scope, "key": native_key, **condition},
                     _read_fields(store, "key", key="key", expected_version="If-Match"))
        return Response(status_code=204)

    async def bulk(request: Request) -> Response:
        store = store_of(request)
        keys = decode(await read(request), Bulk).keys
        if len(keys) > MAX_GET_MANY:  # (before grouping: a store spanning scopes would make
            # one native get-many per scope its keys name, as many as the keys at worst)
            raise failed("ERR_STATE_BULK_GET", InvalidRequest(
                f"$.keys: at most {MAX_GET_MANY} keys, got {len(keys)}",
                {"path": "$.keys", "size": len(keys), "limit": MAX_GET_MANY}),
                f"failed getting state from {store.name}")
        by_scope: dict[str, list[tuple[int, str]]] = {}
        for i, key in enumerate(keys):
            scope, native_key = store.address(key, f"$.keys[{i}]")
            by_scope.setdefault(scope, []).append((i, native_key))
        items: list[dict[str, Any]] = [{"key": key} for key in keys]
        # Bytes of values answered, each key as often as asked, counted as read: scope by
        # scope in the order the keys first name them (one scope: the keys' own order).
        answered = 0
        for scope, wanted in by_scope.items():
            first: dict[str, int] = {}  # each key once (get-many's), at its first index
            for i, native_key in wanted:
                first.setdefault(native_key, i)
            fields = _read_fields(store, f"$.keys[{wanted[0][0]}]", keys="$.keys")
            for n, i in enumerate(first.values()):
                fields.add(f"$.keys[{n}]", f"$.keys[{i}]")
            got = msgspec.json.decode(await native(
                request, "ERR_STATE_BULK_GET", f"failed getting state from {store.name}",
                "state::get-many", {"scope": scope, "keys": list(first)}, fields), type=Entries)
            found = dict(zip(first, got.entries, strict=True))
            for i, native_key in wanted:
                entry = found[native_key]
                if entry.version is not None:
                    answered += len(entry.value)  # (native get-many's bound, over the answer:
                    # a key asked again and again, or a key each of many scopes)
                    if answered > max_call_bytes:
                        raise failed("ERR_STATE_BULK_GET", keys_too_large(
                            i, answered, max_call_bytes), f"failed getting state from {store.name}")
                    items[i] = {"key": keys[i], "data": entry.value, "etag": str(entry.version)}
                    if entry.expires_at is not None:  # (as a get's `ttlExpireTime`)
                        items[i]["metadata"] = {"ttlExpireTime": rfc3339_s(entry.expires_at)}
        return Response(msgspec.json.encode(items), 200, media_type=JSON)

    async def transaction(request: Request) -> Response:
        store = store_of(request)
        asked = decode(await read(request), Transaction)
        url, shared = url_metadata(request.query_params), (asked.metadata or {}, "$.metadata.")
        ops = [_operation(store, op, url, shared, f"$.operations[{i}]")
               for i, op in enumerate(asked.operations)]
        if not ops:
            return Response(status_code=204)
        await write(request, store, "ERR_STATE_TRANSACTION", f"failed executing state "
                    f"transaction in {store.name}", "a transaction", ops, "$.operations")
        return Response(status_code=204)

    async def query(request: Request) -> Response:
        store = store_of(request)
        if store.spans:
            raise DaprError("ERR_NOT_SUPPORTED_STATE_OPERATION", 400, f"store {store.name} "
                            "spans several scopes: a query reads one (configure a store per "
                            "scope to query it)")
        asked = decode(await read(request), dapr_query.Query)

        async def page(body: dict[str, Any], fields: Fields) -> dapr_query.Found:
            return msgspec.json.decode(await native(
                request, "ERR_STATE_QUERY", f"failed query in state store {store.name}",
                "state::query", body, fields), type=dapr_query.Found)

        entries, token = await dapr_query.run(asked, page, store.scope, max_call_bytes)
        out: dict[str, Any] = {"results": [
            {"key": e.key, "data": e.value, "etag": str(e.version)} for e in entries]}
        if token is not None:
            out["token"] = token
        return Response(msgspec.json.encode(out), 200, media_type=JSON)

    async def healthz(_: Request) -> Response:
        return Response(status_code=204)

    async def metadata(_: Request) -> Response:
        components = [{"name": name, "type": "state.stateworker", "version": "v1",
                       "capabilities": CAPABILITIES} for name in sorted(stores)]
        return Response(msgspec.json.encode({
            "id": app_id, "runtimeVersion": f"{_package} {version}", "enabledFeatures": [],
            "actorRuntime": {"runtimeStatus": "DISABLED"}, "components": components,
            "extended": {}, "subscriptions": [], "httpEndpoints": []}), 200, media_type=JSON)

    return [
        Route("/v1.0/healthz", healthz, methods=["GET"]),
        Route("/v1.0/healthz/outbound", healthz, methods=["GET"]),
        Route("/v1.0/metadata", metadata, methods=["GET"]),
        Route("/v1.0/state/{store}", _dapr(save), methods=WRITES),
        Route("/v1.0/state/{store}/bulk", _dapr(bulk), methods=WRITES),
        Route("/v1.0/state/{store}/transaction", _dapr(transaction), methods=WRITES),
        Route("/v1.0-alpha1/state/{store}/query", _dapr(query), methods=WRITES),
        Route("/v1.0/state/{store}/{key:path}", _dapr(get), methods=["GET"]),
        Route("/v1.0/state/{store}/{key:path}", _dapr(delete), methods=["DELETE"]),
    ]


class _Found(msgspec.Struct):
    found: bool = True
    value: msgspec.Raw = msgspec.Raw(b"null")
    version: int | None = None
    expires_at: str | None = None


def _dapr(handler: Handler) -> Handler:
    """`handler` with its errors as Dapr's body and status; a refusal before any Dapr
    operation (the caller unknown, not allowed, the body too large) keeps its own status."""
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except DaprError as exc:
            return Response(exc.body(), exc.status, media_type=JSON)
        except StateError as exc:
            error = failed("ERR_MALFORMED_REQUEST", exc, "the request")
            return Response(error.body(), error.status, media_type=JSON)

    return answered


def _keys(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in op.items() if k != "scope"} for op in ops]


def _scope_field(store: Store, fields: Fields, key_field: str) -> Fields:
    """`fields` with the Dapr field a native scope came from: the key's app (`<app>||<key>`)
    in a store spanning scopes, else the store (the URL's)."""
    fields.add("$.scope", key_field if store.spans else "store", made=True)
    return fields


def _read_fields(store: Store, key_field: str, **fixed: str) -> Fields:
    return _scope_field(store, Fields(**fixed), key_field)


def _write_fields(store: Store, ops: list[dict[str, Any]], body: str,
                  reread: list[str]) -> Fields:
    """The Dapr fields of a write's native calls: native op `j` is the `j`th key the
    operations name (`in_order`), its condition the first operation's on the key, its value
    and TTL the last's; the keys read first (`reread`) each its first operation's key."""
    first: dict[str, dict[str, Any]] = {}
    last: dict[str, dict[str, Any]] = {}
    for op in ops:
        first.setdefault(op["key"], op)
        last[op["key"]] = op
    fields = _scope_field(store, Fields(ops=body, keys=body), f"{ops[0]['where']}.key")
    for j, key in enumerate(first):
        fields.write_op(f"$.ops[{j}]", first[key]["where"], last[key]["where"],
                        last[key].get("ttl_from"))
    for n, key in enumerate(reread):
        fields.add(f"$.keys[{n}]", f"{first[key]['where']}.key")
    return fields


def _one_scope(ops: list[dict[str, Any]], what: str) -> str:
    scopes: set[str] = {op["scope"] for op in ops}
    if len(scopes) > 1:
        raise malformed(f"{what} writes one scope atomically; its keys name "
                        f"{', '.join(sorted(scopes)[:3])}…")
    return scopes.pop()


def _operation(store: Store, operation: Any, url: dict[str, str], shared: Layer,
               where: str) -> dict[str, Any]:
    item: Item = operation.request
    scope, key = store.address(item.key, f"{where}.request.key")
    if operation.operation == "upsert":
        op = upsert(item, key, f"{where}.request", "ERR_STATE_TRANSACTION", url, shared)
    elif operation.operation == "delete":
        op = {"op": "delete", "key": key, "where": f"{where}.request",
              **expected(item.etag, f"{where}.request.etag", "ERR_STATE_TRANSACTION")}
    else:
        raise DaprError("ERR_NOT_SUPPORTED_STATE_OPERATION", 400, f"{where}.operation: "
                        f"operation type {shown(operation.operation)} not supported "
                        "(upsert or delete)")
    return {**op, "scope": scope}
