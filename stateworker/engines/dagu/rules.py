"""Dagu's state steps as Dagu reads them: the `with:` fields decoded (schemas.py), where a
key lives, the checks with Dagu's own texts, and the value as Dagu stores it.

Dagu's texts come in three families, each with its prefix: `state: configuration error: ...`
(the step's configuration: key, value, limit, scope), `dag state: invalid ref: ...` (a
namespace, key or prefix Dagu's store refuses) and `dag state: <condition>` (not found,
conflict, value too large). The quoted values are Go's `%q`; spaces are trimmed as Go's
`strings.TrimSpace` trims them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

import msgspec
from msgspec import UNSET, Raw

from stateworker import codec
from stateworker.context import CallContext
from stateworker.engines.dagu.schemas import DaguRequest
from stateworker.errors import (
    Conflict,
    InvalidContext,
    InvalidRequest,
    KeyTooLong,
    StateError,
    UnknownField,
    ValueTooLarge,
)
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan

SCOPES = ("dag", "root_dag", "global", "custom")
GLOBAL_NAMESPACE = "_"  # Dagu's DefaultGlobalNamespace
NATIVE_PREFIX = "dagu/"  # native scopes `dagu/<scope>/<namespace>`
MAX_LIMIT = 2**31 - 1  # Dagu refuses a list limit above a 32-bit int
MAX_VERSION = 2**63 - 1  # an int64, as Dagu's expected_version

# unicode.IsSpace: what Go's strings.TrimSpace removes (Python's strip() also removes
# U+001C..U+001F, which Go keeps).
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007" \
           "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_QUOTE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                  "\t": "\\t", "\v": "\\v", "\\": "\\\\", '"': '\\"'}
_DECIMAL = re.compile(r"[+-]?[0-9]+")
FIELDS = tuple(DaguRequest.__struct_fields__)


class Place(NamedTuple):
    """Where a Dagu entry lives: its Dagu scope and namespace, and `native`, the native scope
    `dagu/<scope>/<namespace>` that holds it (the Dagu scope is part of it, as it is of
    Dagu's record ids)."""

    scope: str
    namespace: str
    native: str


def go_trim(text: str | None) -> str:
    return (text or "").strip(GO_SPACE)


def go_quote(text: str) -> str:
    """Go's `%q` of a string (strconv.Quote)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[char])
        elif char.isprintable():  # (Python's printable set is Go's IsPrint)
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def go_time(text: str | None) -> str:
    """An RFC 3339 time in milliseconds as Go's RFC3339Nano writes it: the fraction's
    trailing zeros dropped, and the fraction with them when it is zero."""
    head, _, fraction = (text or "").removesuffix("Z").partition(".")
    fraction = fraction.rstrip("0")
    return f"{head}.{fraction}Z" if fraction else f"{head}Z"


def configuration_error(text: str, field: str) -> InvalidRequest:
    return InvalidRequest(f"state: configuration error: {text}", {"path": f"$.{field}"})


def invalid_ref(text: str, path: str) -> InvalidRequest:
    return InvalidRequest(f"dag state: invalid ref: {text}", {"path": path})


_DECODER = msgspec.json.Decoder(DaguRequest)


def decode(body: bytes) -> DaguRequest:
    """The step's fields; a malformed body is INVALID_REQUEST naming the field, an unknown
    field UNKNOWN_FIELD with Dagu's list of fields. (A well-formed body takes one C call: this is on
    every Dagu call's path.)"""
    try:
        return _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError):
        pass  # (the native decoding says what is wrong, with its path)
    try:
        return validate.request(body, DaguRequest)
    except UnknownField as exc:
        raise validate.unknown_field("$", exc.details["path"][2:], FIELDS,
                                     "a Dagu state step takes only") from exc


_TAKES_VALUE = ("set", "diff")


def configuration(action: str, req: DaguRequest) -> None:
    """What Dagu checks of a step before it runs (`dagu validate`)."""
    if action != "list" and not go_trim(req.key):
        raise configuration_error("key is required", "key")
    if action in _TAKES_VALUE and req.value is UNSET:  # (null is a value)
        raise configuration_error(f"value is required for {action}", "value")
    if (req.limit or 0) < 0:
        raise configuration_error("limit must be greater than or equal to zero", "limit")


# ---- where an entry lives ---------------------------------------------------------------------
# A step addresses the same few places and keys again and again: each is resolved and
# checked once (pure functions of the step's fields, the context's DAG names and the limit,
# cached; an error is raised again each time, never cached). Only short texts are cached:
# 4096 entries of at most CACHED_CHARS characters in all stay under 17 MiB, where long ones
# (a key may be sent 4 MiB long, to be refused) would not.
_RESOLVED = 4096
CACHED_CHARS = 1024


class _NotText(NamedTuple):
    """A context DAG name that is not text (any JSON value, hashable as its type's name)."""

    kind: str


DagName = str | _NotText | None


def _dag_names(ctx: CallContext) -> tuple[DagName, DagName]:
    """The context's `dag_name` and `root_dag_name`, as cache keys."""
    dag, root = ctx.context.get("dag_name"), ctx.context.get("root_dag_name")
    if not (dag is None or type(dag) is str):
        dag = _NotText(type(dag).__name__)
    if not (root is None or type(root) is str):
        root = _NotText(type(root).__name__)
    return dag, root


def place(req: DaguRequest, ctx: CallContext, max_bytes: int) -> Place:
    """The scope (default `dag`) and namespace (given, else from the step's DAG); checked,
    also that the native scope `dagu/<scope>/<namespace>` fits `max_bytes` (max_key_bytes)."""
    dag, root = _dag_names(ctx)
    short = len(req.scope or "") + len(req.namespace or "") + len(dag or "") + \
        len(root or "") <= CACHED_CHARS
    return (_place if short else _place.__wrapped__)(req.scope, req.namespace, dag, root,
                                                     max_bytes)


def address(action: str, req: DaguRequest, ctx: CallContext, max_bytes: int
            ) -> tuple[Place, str]:
    """The place and the key (trimmed, checked) of a get, set, delete or diff, after the
    step's `configuration` (in its order: the key, then the value, then the limit)."""
    if (req.value is UNSET and action in _TAKES_VALUE) or (req.limit or 0) < 0:
        configuration(action, req)  # (raises, naming the first problem)
    dag, root = ctx.context.get("dag_name"), ctx.context.get("root_dag_name")
    if not ((dag is None or type(dag) is str) and (root is None or type(root) is str)):
        dag, root = _dag_names(ctx)
    short = len(req.scope or "") + len(req.namespace or "") + len(req.key or "") + \
        len(dag or "") + len(root or "") <= CACHED_CHARS  # (a _NotText is 1 long)
    return (_address if short else _address.__wrapped__)(req.scope, req.namespace, req.key,
                                                         dag, root, max_bytes)


@functools.lru_cache(maxsize=_RESOLVED)
def _address(scope: str | None, namespace: str | None, key: str | None, dag: DagName,
             root: DagName, max_bytes: int) -> tuple[Place, str]:
    trimmed = go_trim(key)
    if not trimmed:
        raise configuration_error("key is required", "key")
    where = _place(scope, namespace, dag, root, max_bytes)
    check_key(trimmed)
    return where, trimmed


@functools.lru_cache(maxsize=_RESOLVED)
def _place(given_scope: str | None, given_namespace: str | None, dag: DagName,
           root: DagName, max_bytes: int) -> Place:
    scope = go_trim(given_scope) or "dag"
    if scope not in SCOPES:
        raise configuration_error(f"unsupported scope {go_quote(scope)}", "scope")
    namespace, path = go_trim(given_namespace), "$.namespace"
    if not namespace:
        if scope == "custom":
            raise configuration_error("namespace is required for custom scope", "namespace")
        namespace, path = _default_namespace(scope, dag, root)
    if not go_trim(namespace):
        raise invalid_ref("namespace is required", path)
    if "/" in namespace or "\\" in namespace or namespace in (".", ".."):
        raise invalid_ref(f"invalid namespace {go_quote(namespace)}", path)
    native = f"{NATIVE_PREFIX}{scope}/{namespace}"
    size = len(native.encode())
    if size > max_bytes:
        raise KeyTooLong(
            f"namespace {go_quote(namespace[:100])}: its native scope dagu/{scope}/<namespace> "
            f"would be {size} bytes, more than the limit of {max_bytes} bytes (max_key_bytes)",
            {"path": path, "size": size, "limit": max_bytes})
    return Place(scope, namespace, native)


def _default_namespace(scope: str, dag: DagName, root: DagName) -> tuple[str, str]:
    """The namespace of a scope given none (`dag`, `root`: the context's `dag_name` and
    `root_dag_name`), and the context field it came from. Dagu takes the step's DAG name as
    it is, the root run's name trimmed."""
    if scope == "global":
        return GLOBAL_NAMESPACE, "$.namespace"
    if scope == "root_dag":
        root_name = go_trim(_context_text(root, "root_dag_name", scope))
        if root_name:
            return root_name, "context.root_dag_name"
    name = _context_text(dag, "dag_name", scope)
    if not name:
        raise InvalidContext(
            f"context.dag_name: Dagu's {scope} scope takes its namespace from the call's "
            "context (dag_name: the step's DAG, Dagu's DAG_NAME"
            + (", or root_dag_name" if scope == "root_dag" else "") + "), which has none; "
            "send it (stateworker call --context '{\"dag_name\":\"...\"}') or give namespace",
            {"path": "context.dag_name"})
    return name, "context.dag_name"


def _context_text(value: DagName, name: str, scope: str) -> str:
    if not isinstance(value, _NotText):
        return value or ""
    raise InvalidContext(f"context.{name}: must be text (the name of a DAG, for Dagu's {scope} "
                         f"scope), got {value.kind}", {"path": f"context.{name}"})


def check_key(key: str, name: str = "key", path: str = "$.key") -> None:
    """Dagu's key rule: `/`-separated parts, none empty, `.` or `..`; no `\\`."""
    if not go_trim(key):
        raise invalid_ref(f"{name} is required", path)
    if "/" not in key and "\\" not in key and key not in (".", ".."):
        return  # (the common key: one part, no separator)
    if key.startswith("/") or key.endswith("/") or "\\" in key or \
            any(part in ("", ".", "..") for part in key.split("/")):
        raise invalid_ref(f"invalid {name} {go_quote(key)}", path)


def list_prefix(req: DaguRequest) -> str:
    """The list's key prefix (trimmed): a key's start, perhaps ending with `/`."""
    prefix = go_trim(req.prefix)
    if prefix.startswith("/") or "\\" in prefix:
        raise invalid_ref(f"invalid key prefix {go_quote(prefix)}", "$.prefix")
    if prefix.removesuffix("/"):
        check_key(prefix.removesuffix("/"), "key_prefix", "$.prefix")
    return prefix


def list_limit(req: DaguRequest) -> int:
    """The list's limit; 0 (or none) is no limit."""
    limit = req.limit or 0
    if limit > MAX_LIMIT:
        raise invalid_ref(f"limit exceeds {MAX_LIMIT}", "$.limit")
    return limit


def expected_version(value: int | str | None) -> int | None:
    """An integer, or its base-10 text (Dagu decodes the field weakly)."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            raise InvalidRequest(f"$.expected_version: must be an integer or its base-10 text, "
                                 f"got {go_quote(value)}", {"path": "$.expected_version"})
        value = int(value)
    if value is not None:
        validate.in_range("expected_version", value, 0, MAX_VERSION,
                          " (a version; a negative one never matches)")
    return value


# ---- values -------------------------------------------------------------------------------------
def normalized(state: RedisState, raw: Raw, field: str) -> codec.Value:
    """Dagu's normalized value: compact JSON with every object's keys sorted and numbers as
    written (Go's encoding/json), which is the canonical form, so its SHA-256 is its hash.
    Its size counts against `max_value_bytes`."""
    limit = state.settings.max_value_bytes
    try:
        return codec.canonical_value_from_json(bytes(raw), field, limit)
    except ValueTooLarge as exc:
        size = exc.details["size"]
        raise ValueTooLarge(too_large_text(size, limit),
                            {"path": f"$.{field}", "size": size, "limit": limit}) from exc


def too_large_text(size: int, limit: int) -> str:
    return f"dag state: value too large: {size} bytes exceeds {limit}"


# ---- Dagu's texts for the native errors -------------------------------------------------------
def conflict(details: dict[str, object]) -> Conflict:
    return Conflict("dag state: conflict", details)


def in_dagu_terms(exc: StateError) -> StateError:
    """A native error as Dagu says it (code and details kept)."""
    if isinstance(exc, Conflict):
        return conflict(exc.details)
    if isinstance(exc, ValueTooLarge) and "size" in exc.details:
        return ValueTooLarge(too_large_text(exc.details["size"], exc.details["limit"]),
                             exc.details)
    return exc


def raise_in_dagu_terms(exc: StateError) -> NoReturn:
    translated = in_dagu_terms(exc)
    if translated is exc:
        raise exc
    raise translated from exc


def in_dagu_texts(plan: Plan, answer: Callable[[Any], Any]) -> Plan:
    """`plan` (a native write), its result passed through `answer`, its errors (in any of
    its steps) in Dagu's terms."""
    def finish(replies: list[Any]) -> Any:
        try:
            out = plan.finish(replies)
        except StateError as exc:
            raise_in_dagu_terms(exc)
        return in_dagu_texts(out, answer) if isinstance(out, Plan) else answer(out)

    return Plan(plan.commands, finish, plan.checks_deadline, plan.binds_call_id)
