"""Dapr's state requests read into native calls (app/dapr.py serves them): the configured stores,
the request bodies as Dapr's HTTP API reference gives them (unknown fields refused, as the
native API refuses them), ETags, the `metadata.*` of the URL and of an item (the URL's
winning, as in Dapr's runtime: `ruling`), the options, a transaction's operations applied in
order, and Dapr's error codes and statuses.

Stores (STATEWORKER_DAPR_STORES, comma-separated; unset: `statestore`):
    `name`            the store `name` is the scope `name`
    `name=scope`      the store `name` is the scope `scope`
    `name=prefix*`    the store `name` spans the scopes `prefix<app>`: a key is `<app>||<key>`,
                      Dapr's own key scheme (its `||` is reserved in a Dapr key)
A store not configured is Dapr's ERR_STATE_STORE_NOT_FOUND (400): a typo never makes a scope.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from stateworker.codec import DEPTH_MESSAGE, MAX_DEPTH, whole_number
from stateworker.error_codes import HTTP_STATUS
from stateworker.errors import ConfigError, InvalidRequest, StateError, shown
from stateworker.settings import Settings
from stateworker.state.core.validate import MAX_TTL_MS

DEFAULT_STORES = "statestore"
SEPARATOR = "||"  # Dapr's key scheme: <app id>||<key>
CAPABILITIES = ["ETAG", "TRANSACTIONAL", "TTL", "QUERY_API"]


class DaprError(Exception):
    """An error as Dapr answers it: `{"errorCode", "message", "details"}` and its status."""

    def __init__(self, code: str, status: int, message: str,
                 reason: StateError | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason

    def body(self) -> bytes:
        """Dapr's error body; `details` is Dapr's ErrorInfo naming our own code and fields."""
        document: dict[str, Any] = {"errorCode": self.code, "message": self.message}
        if self.reason is not None:
            document["details"] = [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo", "domain": "stateworker",
                "reason": self.reason.code,
                "metadata": {k: v if isinstance(v, str) else msgspec.json.encode(v).decode()
                             for k, v in self.reason.details.items()}}]
        return msgspec.json.encode(document)


def malformed(message: str) -> DaprError:
    return DaprError("ERR_MALFORMED_REQUEST", 400, message)


def failed(code: str, exc: StateError, what: str) -> DaprError:
    """A native refusal as the operation's Dapr error (`code`: ERR_STATE_SAVE …): an ETag that
    does not hold is 409 as in Dapr, in Dapr's words ("possible etag mismatch", which programs
    match to retry), a request the service refuses its 4xx, anything else 500."""
    if exc.code == "CONFLICT":
        return DaprError(code, 409, f"{what}: possible etag mismatch: {exc.message}", exc)
    status = HTTP_STATUS.get(exc.code, 500)
    if status >= 500:
        status = 500
    return DaprError(code, status, f"{what}: {exc.message}", exc)


class Store(msgspec.Struct, frozen=True):
    """One configured store: a scope, or a scope prefix (`spans`)."""

    name: str
    scope: str
    spans: bool = False

    def address(self, key: str, where: str) -> tuple[str, str]:
        """(scope, key) of a Dapr key of this store."""
        if not key:
            raise malformed(f'{where}: "key" is a required field')
        if not self.spans:
            _no_separator(key, where)
            return self.scope, key
        app, sep, rest = key.partition(SEPARATOR)
        if not sep or not app or not rest:
            raise malformed(f"{where}: store {shown(self.name)} spans the scopes "
                            f"{shown(self.scope + '*')}: a key is `<app>||<key>`, got {shown(key)}")
        return self.scope + app, rest


def _no_separator(key: str, where: str) -> None:
    """Dapr's runtime refuses a key holding its separator, whatever the store (its
    GetModifiedStateKey: `can't contain '||'`): taken in a store of one scope, a program that
    ran here failed on Dapr (decision 0074). A store spanning scopes is keyed by it."""
    if SEPARATOR in key:
        raise malformed(f"{where}: a Dapr key can't contain '{SEPARATOR}' (Dapr's key "
                        f"separator, `<app>||<key>`), got {shown(key)}")


def dapr_stores(settings: Settings) -> dict[str, Store]:
    """The stores STATEWORKER_DAPR_STORES configures (module docstring)."""
    try:
        return parse_stores(settings.dapr_stores)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_stores(text: str | None) -> dict[str, Store]:
    """STATEWORKER_DAPR_STORES read (module docstring); ValueError names what is wrong."""
    stores: dict[str, Store] = {}
    for item in (text if text is not None else DEFAULT_STORES).split(","):
        name, _, target = (part.strip() for part in item.strip().partition("="))
        if not name:
            continue
        target = target or name
        spans = target.endswith("*")
        scope = target[:-1] if spans else target
        if name in stores or not scope or "*" in scope or "/" in name:
            raise ValueError(f"STATEWORKER_DAPR_STORES: {item.strip()!r} (want `name`, "
                             "`name=scope` or `name=prefix*`, each name once)")
        stores[name] = Store(name, scope, spans)
    return stores


# Dapr's options; `""` is none given, as its stores read it (validateConcurrencyOption)
Concurrency = Literal["first-write", "last-write", ""]
Consistency = Literal["eventual", "strong", ""]
URL_OPTIONS = {"concurrency": get_args(Concurrency), "consistency": get_args(Consistency)}


class Options(msgspec.Struct, forbid_unknown_fields=True):
    concurrency: Concurrency | None = None
    consistency: Consistency | None = None


class Item(msgspec.Struct, forbid_unknown_fields=True):
    key: str = ""
    value: msgspec.Raw = msgspec.Raw(b"null")
    etag: str | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    options: Options = msgspec.field(default_factory=Options)


class Operation(msgspec.Struct, forbid_unknown_fields=True):
    operation: str  # upsert | delete
    request: Item


class Transaction(msgspec.Struct, forbid_unknown_fields=True):
    # (none given: none to do, as Dapr's decoding leaves a list it is not sent empty)
    operations: list[Operation] = msgspec.field(default_factory=list)
    metadata: dict[str, str] | None = None


class Bulk(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[str] = msgspec.field(default_factory=list)  # (none given: none read, as Dapr)
    parallelism: int | None = None  # (Dapr's SDKs send it; one call reads every key here)
    metadata: dict[str, str] | None = None


def decode(body: bytes, type_: Any) -> Any:
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.DecodeError as exc:
        raise malformed(f"the request body: {exc}") from exc
    except RecursionError as exc:  # (deeper than the decoder goes: past the native bound)
        reason = InvalidRequest(f"$: the request body is {DEPTH_MESSAGE}",
                                {"path": "$", "limit": MAX_DEPTH})
        raise DaprError("ERR_MALFORMED_REQUEST", 400, reason.message, reason) from exc


def url_metadata(query: Any) -> dict[str, str]:
    """The `metadata.<name>=<value>` parameters of a request's URL."""
    return {name[9:]: value for name, value in query.items() if name.startswith("metadata.")}


def url_options(query: Any, names: tuple[str, ...]) -> None:
    """A get's `consistency`, a delete's `concurrency` and `consistency` on the URL, checked as
    a save's options are: Dapr's stores refuse a value they do not know, and nothing is done
    (CheckRequestOptions). Each changes nothing else here (docs/http.md)."""
    for name in names:
        value = query.get(name)
        if value is not None and value not in URL_OPTIONS[name]:
            raise malformed(f"{name}: {shown(value)} is no {name} (want "
                            f"{' or '.join(v for v in URL_OPTIONS[name] if v)}, or none)")


def expected(etag: str | None, where: str, code: str) -> dict[str, int]:
    """`expected_version` for an ETag (none: no condition). An ETag is opaque to a client;
    ours is an entry's version, as GET gave it: any other is Dapr's invalid ETag (400)."""
    if etag is None or etag == "":
        return {}
    version = whole_number(etag.strip('"'))
    if version is None or not 1 <= version <= 2**53:
        raise DaprError(code, 400, f"{where}: invalid etag {shown(etag)}: an ETag of this store "
                                   "is what GET or bulk gave for the key")
    return {"expected_version": version}


Layer = tuple[dict[str, str], str]  # metadata, and the field its names are under


def ruling(name: str, layers: list[Layer]) -> tuple[str, str] | None:
    """Metadata `name`'s value and the field it came from, the last of `layers` that gives it
    winning: Dapr's runtime copies the URL's `metadata.*` over an item's (a save's, a
    transaction operation's: its HTTP API's onPostState), so the URL's wins; a transaction's
    own `metadata` applies to every operation that does not say (decision 0065)."""
    for metadata, where in reversed(layers):
        if name in metadata:
            return metadata[name], where + name
    return None


def ttl_ms(layers: list[Layer]) -> tuple[int | None, str | None]:
    """`ttlInSeconds` in ms and its field (none: never expire, as Dapr's stores read -1, 0
    and "", the last as not given), at most ten years as native TTLs are. `contentType` is
    taken as given (the value is stored as its JSON text whatever it says)."""
    found = ruling("ttlInSeconds", layers)
    if found is None:
        return None, None
    ttl, field = found
    if not ttl or ttl == "-1":
        return None, field
    seconds = whole_number(ttl, 12)
    if seconds is None or seconds > MAX_TTL_SECONDS:
        raise malformed(f"{field}: a whole number of seconds, at most {MAX_TTL_SECONDS} (ten "
                        f"years; 0 or -1: never expire), got {shown(ttl)}")
    return seconds * 1000 or None, field


MAX_TTL_SECONDS = MAX_TTL_MS // 1000


def upsert(item: Item, key: str, where: str, code: str, url: dict[str, str],
           shared: Layer | None = None) -> dict[str, Any]:
    """A save as a native set, `where` its Dapr field; its metadata its own over `shared` (a
    transaction's), the `url`'s over both (`ruling`). `first-write` without an ETag (or with
    an empty one) writes only a key that is absent, as Dapr's stores do (its state
    conformance: a second first-write save of a key fails); without it a concurrent writer's
    save was overwritten."""
    condition = expected(item.etag, f"{where}.etag", code)
    if not condition and item.options.concurrency == "first-write":
        condition = {"expected_version": 0}
    op: dict[str, Any] = {"op": "set", "key": key, "value": item.value, **condition}
    ttl, field = ttl_ms([*([shared] if shared else []), (item.metadata, f"{where}.metadata."),
                         (url, "metadata.")])
    if ttl is not None:
        op["ttl_ms"] = ttl
    return {**op, "where": where, "ttl_from": field}


OWN = ("expected_version", "where", "ttl_from")  # (`where`, `ttl_from`: Dapr's fields, not sent)
UNKNOWN = -1  # a key's version not known here (no ETag on its first operation, not read)


def in_order(ops: list[dict[str, Any]], versions: dict[str, int | None],
             code: str = "ERR_STATE_TRANSACTION") -> list[dict[str, Any]]:
    """A Dapr transaction's operations (or a save's items) applied in order, as one native op
    per key (what each key finally becomes). `versions`: the stored version of the keys read
    first (None: absent; `repeated_with_etag`). A later operation's ETag must hold for what
    the earlier ones made of the key (else `code`, 409); the native op keeps the condition
    on the stored entry: the first operation's ETag, or the version read."""
    final: dict[str, dict[str, Any]] = {}
    now: dict[str, int | None] = {}  # a key's version after the operations so far
    for op in ops:
        key, where = op["key"], op.get("where", "")
        want = op.get("expected_version")
        if key not in final:
            read = versions.get(key, UNKNOWN)
            condition = {"expected_version": want} if want is not None else \
                {} if read == UNKNOWN or (read is None and op["op"] == "delete") else \
                {"expected_version": 0 if read is None else read}
            current = want if want is not None else read
        else:
            current = now[key]
            if want is not None and (want or None) != current:  # (0: absent, as None)
                raise DaprError(code, 409, f"{where}.etag: possible etag mismatch: the "
                                f"operations before it leave key {shown(key)} "
                                f"{'absent' if current is None else f'at {current}'}")
            condition = {k: v for k, v in final[key].items() if k == "expected_version"}
        final[key] = {**{k: v for k, v in op.items() if k not in OWN}, **condition}
        now[key] = None if op["op"] == "delete" else \
            UNKNOWN if current == UNKNOWN else 1 if current is None else current + 1
    return [_native(op) for op in final.values()]


def _native(op: dict[str, Any]) -> dict[str, Any]:
    """A delete conditioned on absence (version 0) is no condition: nothing to delete."""
    if op["op"] == "delete" and op.get("expected_version") == 0:
        return {k: v for k, v in op.items() if k != "expected_version"}
    return op


def repeated_with_etag(ops: list[dict[str, Any]]) -> list[str]:
    """The keys written more than once with an ETag on a later operation: their stored
    versions are read first (`in_order`)."""
    seen: set[str] = set()
    wanted: list[str] = []
    for op in ops:
        if op["key"] in seen and "expected_version" in op and op["key"] not in wanted:
            wanted.append(op["key"])
        seen.add(op["key"])
    return wanted
