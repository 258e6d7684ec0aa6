"""Request checks shared by the JSON functions and the typed Python API.

Every check raises a StateError whose message names the field, the problem and the limit,
before anything is written.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from msgspec import inspect as mi

from stateworker import codec
from stateworker.context import CallContext
from stateworker.errors import (
    Forbidden,
    InvalidPrefix,
    InvalidRequest,
    InvalidScope,
    KeyTooLong,
    ReservedScope,
    StateError,
    UnknownCaller,
    UnknownField,
    nearest,
    shown,
)
from stateworker.keys import BUS_NAME_RULES, bus_name_problem
from stateworker.settings import Settings
from stateworker.state.core import guard

if TYPE_CHECKING:  # (store.py's operations call these checks; only its type is needed)
    from stateworker.state.core.store import RedisState

# Scopes the service keeps for its own bookkeeping; no public function may name them.
BARRIER_SCOPE = "state_barrier"  # barriers (state::barrier), which are not entries
INDEXES_SCOPE = "state_indexes"  # index definitions (state/query/indexes.py), kept by the snapshot
RESERVED_SCOPES = frozenset({BARRIER_SCOPE, "state_triggers", "state_namespaces", INDEXES_SCOPE})
_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,256}")  # a namespace is a caller: at most 256 bytes
MAX_TTL_MS = 10 * 365 * 24 * 3600 * 1000  # ten years

T = TypeVar("T")
_PATH_RE = re.compile(r" - at `(\$[^`]*)`$")
_UNKNOWN_RE = re.compile(r"Object contains unknown field `(.*)`", re.DOTALL)
_MISSING_RE = re.compile(r"Object missing required field `(.*)`", re.DOTALL)
_decoders: dict[type, msgspec.json.Decoder] = {}  # type: ignore[type-arg]


def request(body: bytes, type_: type[T], *, root: str = "$",
            error: type[StateError] = InvalidRequest) -> T:
    """Decode a request body; a malformed one is INVALID_REQUEST with `details.path`.

    A part of a request decoded on its own (state::barrier's `condition_config`) names its
    place as `root` (`$.condition_config`) and may raise its own `error` class."""
    what = "the request body" if root == "$" else "the field"
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        result: T = decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_RE.search(text)
        at = match.group(1) if match else "$"
        path = root + at[1:]
        problem = _PATH_RE.sub("", text)
        unknown = _UNKNOWN_RE.fullmatch(problem)
        shape: Any = type_  # (a type: hashable, as fields_at's and tags_at's caches need)
        if unknown:
            raise unknown_field(path, unknown.group(1),
                                fields_at(shape, at, _kind_at(shape, body, at))) from exc
        missing = _MISSING_RE.fullmatch(problem)
        if missing:  # (msgspec names the object; the caller needs the field: `$.ops[2].by`)
            path = f"{path}.{missing.group(1)}"
            raise error(f"{path}: the field `{missing.group(1)}` is required",
                        {"path": path}) from exc
        kinds = tags_at(shape, at) if problem.startswith("Invalid value") else ()
        if kinds:
            raise error(f"{path}: {problem.removeprefix('Invalid value ')} is not one of "
                        f"{', '.join(kinds)}", {"path": path, "allowed": list(kinds)}) from exc
        if problem.startswith("Expected `object`") and path == root:
            problem = f"{what} must be a JSON object"
        raise error(f"{path}: {problem}", {"path": path}) from exc
    except msgspec.DecodeError as exc:
        raise codec.surrogate_error(body, root) or error(
            f"{root}: {what} is not valid JSON: {exc}", {"path": root}) from exc
    except RecursionError as exc:
        raise error(f"{root}: {what} is {codec.DEPTH_MESSAGE}",
                    {"path": root, "limit": codec.MAX_DEPTH}) from exc
    return result


def unknown_field(where: str, name: str, known: Sequence[str], takes: str = "") -> UnknownField:
    """The one UNKNOWN_FIELD: `name`, a field of the object at `where` that is none of
    `known`, named with the nearest known field; `takes` says whose fields they are
    (default: `<where> takes only`). The engines' front-ends name their function in it
    (engines/moco, engines/dagu)."""
    path, near = f"{where}.{name}", nearest(name, known)
    hint = "" if near is None else f" (did you mean {shown(near)}?)"
    whose = "the request" if where == "$" else where
    fields = f"{takes or whose + ' takes only'} {', '.join(known)}" if known else \
        f"{whose} takes no fields"
    return UnknownField(f"{path}: unknown field {shown(name)}{hint}; {fields}",
                        {"path": path, "nearest": near})


def _infos_at(type_: Any, where: str) -> list[mi.Type]:
    """The types of what sits at `where` (a msgspec path, `$.ops[0]`) in `type_` (every union
    member's)."""
    infos = _members([mi.type_info(type_)])
    for name, _index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", where):
        step: list[mi.Type] = []
        for info in infos:
            if name and isinstance(info, mi.StructType):
                step += [f.type for f in info.fields if f.encode_name == name]
            elif not name and isinstance(info, mi.ListType | mi.TupleType | mi.VarTupleType):
                step += [info.item_type] if isinstance(info, mi.ListType | mi.VarTupleType) \
                    else list(info.item_types)
        infos = _members(step)
    return infos


def _kind_at(type_: Any, body: bytes, where: str) -> str | None:
    """Which member of a tagged union the object at `where` (a msgspec path) in `body` is:
    its tag field's text (an op's `type`, a transaction op's `op`); None when it names none."""
    try:
        found: Any = msgspec.json.decode(body)  # (an error's path only)
    except (msgspec.DecodeError, RecursionError):
        return None
    for name, index in re.findall(r"\.([^.\[]+)|\[(\d+)\]", where):
        found = found.get(name) if name and isinstance(found, dict) else \
            found[int(index)] if index and isinstance(found, list) else None
    kinds = [found.get(info.tag_field) for info in _infos_at(type_, where) if isinstance(
        info, mi.StructType) and info.tag_field and isinstance(found, dict)]
    return next((kind for kind in kinds if isinstance(kind, str)), None)


@functools.lru_cache(maxsize=256)
def fields_at(type_: Any, where: str, kind: str | None = None) -> tuple[str, ...]:
    """The field names of the object at `where` in `type_`: of the union member tagged
    `kind` (an op of `type` `set`), else of every member (an op's whatever its `type`)."""
    names: list[str] = []
    infos = _infos_at(type_, where)
    chosen = [info for info in infos if isinstance(info, mi.StructType) and
              kind is not None and info.tag_field and info.tag == kind]
    for info in chosen or infos:
        if isinstance(info, mi.StructType):
            names += [info.tag_field] if info.tag_field else []
            names += [f.encode_name for f in info.fields]
    return tuple(dict.fromkeys(names))


@functools.lru_cache(maxsize=256)
def tags_at(type_: Any, where: str) -> tuple[str, ...]:
    """The values the tag field at `where` (`$.ops[0].op`) may take: the kinds of a tagged
    union (an update op's `type`, a transaction op's `op`); () when it is no tag field."""
    owner, _, field = where.rpartition(".")
    return tuple(str(info.tag) for info in _infos_at(type_, owner)
                 if isinstance(info, mi.StructType) and info.tag_field == field)


def _members(infos: list[mi.Type]) -> list[mi.Type]:
    """`infos` with every union (and Optional) opened into its members."""
    out: list[mi.Type] = []
    for info in infos:
        out += _members(list(info.types)) if isinstance(info, mi.UnionType) else [info]
    return out


def in_range(field: str, value: int, low: int, high: int, what: str = "",
             error: type[StateError] = InvalidRequest) -> int:
    """The one range check of counts, limits and offsets."""
    if not low <= value <= high:
        raise error(f"$.{field}: must be between {low} and {high}{what}, got {value}",
                    {"path": f"$.{field}", "limit": high})
    return value


def name(settings: Settings, field: str, text: str) -> None:
    """A scope or key: valid UTF-8 and at most `max_key_bytes` bytes."""
    codec.sized_text(field, text, settings.max_key_bytes, KeyTooLong)


def scope(state: RedisState, ctx: CallContext, text: str) -> None:
    """The scope of a call: a name, not reserved, and public -- or, for a namespace's
    accessor (`ctx.namespace`), one that namespace claimed."""
    name(state.settings, "scope", text)
    if text in RESERVED_SCOPES:
        raise ReservedScope(f"scope {shown(text)} is reserved for the service's own bookkeeping",
                            {"path": "$.scope", "scope": text})
    owner = state.claims.owner(text)
    if ctx.namespace is None and owner is not None:
        raise ReservedScope(
            f"scope {shown(text)} is claimed by namespace {shown(owner)}: only its accessors "
            f"({owner}::state::get, ...) serve it", {"path": "$.scope", "scope": text,
                                                     "namespace": owner})
    if ctx.namespace is not None and owner != ctx.namespace:
        raise InvalidScope(
            f"$.scope: {shown(text)} is not a scope of namespace {shown(ctx.namespace)}; its accessors "
            "serve only the scopes it claimed", {"path": "$.scope", "scope": text,
                                                 "namespace": ctx.namespace})
    guard.scope(state, ctx, text)


class _Scope(msgspec.Struct):
    """A body read for its scope alone (any other field, known or not, ignored)."""

    scope: Any = None


_scope_only = msgspec.json.Decoder(_Scope)


def reserved_first(state: RedisState, body: bytes, ctx: CallContext, refusal: StateError
                    ) -> None:
    """A body refused (an unknown field, a bad one) whose scope is reserved or claimed is
    RESERVED_SCOPE, on every scoped function: iii's answer to a claimed scope comes before
    any other, so a private scope is never told apart by the errors of its requests. Runs
    only on a refusal: the happy path pays nothing."""
    try:
        text = _scope_only.decode(body).scope
    except (msgspec.DecodeError, RecursionError):
        return
    if not isinstance(text, str):
        return
    try:
        scope(state, ctx, text)
    except ReservedScope as exc:
        raise exc from refusal
    except StateError:
        return


def address(state: RedisState, ctx: CallContext, scope_text: str, key_text: str) -> None:
    scope(state, ctx, scope_text)
    name(state.settings, "key", key_text)


def hidden_scopes(state: RedisState) -> frozenset[str]:
    """The scopes listings leave out: reserved and claimed ones."""
    return RESERVED_SCOPES | state.claims.scopes


# ---- state::claim-namespace ----------------------------------------------------------------
def functions_prefix(value: Any) -> str:
    if not isinstance(value, str) or not _PREFIX.fullmatch(value):
        raise InvalidPrefix(f"$.functions_prefix: must be 1 to 256 letters, digits, _ and - "
                            f"([A-Za-z0-9_-]+), got {_shown(value)}",
                            {"path": "$.functions_prefix"})
    return value


def _shown(value: Any) -> str:
    text = shown(value)
    return text if len(text) <= 100 else text[:100] + "..."


def identity(ctx: CallContext) -> str | None:
    """Who makes the call: in `acl` mode the principal (from the stream's name, never a field
    of the entry), else the call's `caller`."""
    return ctx.principal if ctx.principal is not None else ctx.caller


def claimant(ctx: CallContext, prefix: str) -> None:
    """A worker claims only the namespace of its own name: in `acl` mode the principal (the
    `caller` field is ignored), else the call's `caller`."""
    if ctx.principal is not None:
        if ctx.principal != prefix:
            raise Forbidden(f"$.functions_prefix: {shown(prefix)} is not the principal's name "
                            f"{shown(ctx.principal)}; a principal claims only its own namespace",
                            {"path": "$.functions_prefix", "principal": ctx.principal})
        return
    if not ctx.caller:
        raise UnknownCaller("the call carries no caller: state::claim-namespace claims the "
                            "namespace of the calling worker (the bus entry's `caller`)",
                            {"path": "caller"})
    if ctx.caller != prefix:
        raise Forbidden(f"$.functions_prefix: {shown(prefix)} is not the caller's name "
                        f"{shown(ctx.caller)}; a worker claims only its own namespace",
                        {"path": "$.functions_prefix", "caller": ctx.caller})


def releaser(ctx: CallContext, force: bool) -> str:
    """Who releases: the caller (or principal), whose own scopes it may release; an admin's
    `force` may come from an in-process call with no caller ("")."""
    who = identity(ctx)
    if not who and not force:
        raise UnknownCaller("the call carries no caller: state::release-namespace releases "
                            "the calling worker's scopes (the bus entry's `caller`)",
                            {"path": "caller"})
    return who or ""


def bus_target(field: str, value: str, limit: int) -> None:
    """A service or function id a call will be sent to: non-empty, at most `limit` bytes,
    and within the bus's name rules (keys.bus_name_problem)."""
    codec.sized_text(field, value, limit)
    if not value:
        raise InvalidRequest(f"$.{field}: must not be empty", {"path": f"$.{field}"})
    problem = bus_name_problem(value)
    if problem is not None:
        raise InvalidRequest(
            f"$.{field}: {_shown(value)} {problem}; a name on the bus has {BUS_NAME_RULES} "
            f"and at most {limit} bytes", {"path": f"$.{field}", "limit": limit})


MAX_CLAIM_SCOPES = 1000  # scopes one claim- or release-namespace call names
# Scopes claimed, at most: by one namespace, and by all of them together. Every claim and
# release reads the whole claims hash (claim.lua, to answer the namespace's scopes), every
# replica holds it in memory and the snapshot copies it on every registry change, so one
# caller claiming without end would make each of those longer for everyone. A namespace's
# share is a tenth of the whole: ten namespaces at least find room.
MAX_NAMESPACE_SCOPES = 1000
MAX_CLAIMED_SCOPES = 10_000


def claim_scopes(settings: Settings, values: list[Any]) -> list[str]:
    """The scopes asked for: at least one and at most MAX_CLAIM_SCOPES (one script run and one
    registry entry every replica applies), each non-empty text, a name, not reserved;
    duplicates once, in the order given."""
    if not values:
        raise InvalidScope("$.scopes: must list at least one scope", {"path": "$.scopes"})
    if len(values) > MAX_CLAIM_SCOPES:
        raise InvalidRequest(f"$.scopes: at most {MAX_CLAIM_SCOPES} scopes a call, got "
                             f"{len(values)}", {"path": "$.scopes", "size": len(values),
                                                "limit": MAX_CLAIM_SCOPES})
    for i, value in enumerate(values):
        field = f"scopes[{i}]"
        if not isinstance(value, str) or not value:
            raise InvalidScope(f"$.{field}: a scope must be non-empty text, got {_shown(value)}",
                               {"path": f"$.{field}"})
        name(settings, field, value)
        if value in RESERVED_SCOPES:
            raise ReservedScope(f"$.{field}: scope {shown(value)} is reserved for the service's own "
                                "bookkeeping", {"path": f"$.{field}", "scope": value})
    return list(dict.fromkeys(values))


MAX_TEXT_BYTES = 1024  # topics, prefixes and patterns


def pattern(field: str, value: str | None) -> str | None:
    """A prefix or `*` pattern: UTF-8, at most 1024 bytes (a pattern's cost in Redis grows
    with its length)."""
    if value is not None:
        codec.sized_text(field, value, MAX_TEXT_BYTES)
    return value


def ttl_ms(value: int | None) -> int | None:
    if value is not None:
        in_range("ttl_ms", value, 1, MAX_TTL_MS, " (ten years)")
    return value


MAX_KEYS_LIMIT = 100_000_000  # a ceiling above this is no ceiling


def max_keys(value: int | None) -> int | None:
    """A scope's ceiling of live keys (KeeperHub's), checked by the script that creates one."""
    if value is not None:
        in_range("max_keys", value, 1, MAX_KEYS_LIMIT)
    return value


def expected_version(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise InvalidRequest(f"$.expected_version: must be 0 or more, got {value}",
                             {"path": "$.expected_version"})
    return value


def delete_version(value: int | None) -> int | None:
    """state::delete's `expected_version`: 1 or more (no entry is at version 0, so a
    delete conditioned on it could never delete anything)."""
    if value is not None and value < 1:
        raise InvalidRequest(f"$.expected_version: must be 1 or more on a delete (the version "
                             f"of the entry to delete; a missing key has none), got {value}",
                             {"path": "$.expected_version", "limit": 1})
    return value


def topic(value: str | None) -> str | None:
    """A topic: UTF-8, at most 1024 bytes, no NUL (it separates topic and key in the index)."""
    if value is not None:
        codec.sized_text("topic", value, MAX_TEXT_BYTES)
        if "\0" in value:
            raise InvalidRequest("$.topic: must not contain the NUL character (\\u0000)",
                                 {"path": "$.topic"})
    return value


def value(settings: Settings, raw: msgspec.Raw, field: str = "value") -> codec.Value:
    return codec.value_from_json(bytes(raw), field, settings.max_value_bytes)
