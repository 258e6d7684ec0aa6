"""moco's State Store Activities: their `input_data` shapes and results, and the namespace rule.

Requests are exactly the fields moco documents; any other field is refused (a misspelt
`in_global_ns` must not silently write to a user's private namespace instead of the shared one).
"""

from __future__ import annotations

import functools
import re
from typing import Literal, TypeVar

import msgspec
from msgspec import Raw, Struct

from stateworker.context import CallContext
from stateworker.errors import InvalidContext, InvalidRequest, KeyTooLong, ReservedNamespace
from stateworker.settings import Settings
from stateworker.state import validate

SECRET = "secret"  # moco keeps secrets in the same table, under `secret` and `<user_id>:secret`
CACHED_CHARS = 1024  # longer namespace + user id: resolved each time (memory: dagu_rules)


# ---- requests (moco's `input_data`) -----------------------------------------------------------
class NamespaceRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    namespace: str
    in_global_ns: bool = False


class KeyRequest(NamespaceRequest, kw_only=True):
    """get_state, get_state_with_ts, del_state."""

    key: str


class SetStateRequest(KeyRequest, kw_only=True):
    value: Raw
    topic: str | None = None  # omitted: the row's earlier topic is cleared (moco's rule)


class UpdateTopicRequest(KeyRequest, kw_only=True):
    topic: str | None = None  # null or omitted: the tag is cleared


class ListStatesRequest(NamespaceRequest, kw_only=True):
    key_pattern: str | None = None
    topic_pattern: str | None = None
    limit: int | None = None  # null: every row
    offset: int | None = None
    order_by: Literal["key", "last_update_time", "topic"] = "key"
    order_direction: Literal["asc", "desc"] = "asc"


class DeleteByTopicRequest(NamespaceRequest, kw_only=True):
    topic_pattern: str


class ListNamespacesRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    name_pattern: str | None = None
    limit: int | None = None  # null: every namespace
    in_global_ns: bool = False


# ---- results ----------------------------------------------------------------------------------
class StateWithTs(Struct):
    value: Raw
    last_update_time: str | None


class StateRow(Struct):
    key: str
    topic: str | None


# ---- decoding ---------------------------------------------------------------------------------
R = TypeVar("R", bound=Struct)
_UNKNOWN = re.compile(r"^\$: Object contains unknown field `(.*)`$", re.DOTALL)
_MISSING = re.compile(r"^\$: Object missing required field `(.*)`$", re.DOTALL)


def request(fn: str, body: bytes, type_: type[R]) -> R:
    """The body as `type_`; INVALID_REQUEST with the path of the field at fault, also for a
    field that is unknown or missing (msgspec names those at the object, `$`)."""
    try:
        return validate.request(body, type_)
    except InvalidRequest as exc:
        unknown, missing = _UNKNOWN.match(exc.message), _MISSING.match(exc.message)
        if unknown:
            field = unknown.group(1)
            fields = ", ".join(f.name for f in msgspec.structs.fields(type_))
            raise InvalidRequest(f"$.{field}: unknown field `{field}`; {fn} takes only "
                                 f"{fields}", {"path": f"$.{field}"}) from exc
        if missing:
            field = missing.group(1)
            raise InvalidRequest(f"$.{field}: the field `{field}` is required by {fn}",
                                 {"path": f"$.{field}"}) from exc
        raise


def count(field: str, value: int | None) -> int | None:
    """`limit` or `offset`: null, or 0 and more."""
    if value is not None and value < 0:
        raise InvalidRequest(f"$.{field}: must be 0 or more (or null), got {value}",
                             {"path": f"$.{field}", "limit": 0})
    return value


# ---- namespaces -------------------------------------------------------------------------------
def is_secret(namespace: str) -> bool:
    return namespace == SECRET or namespace.endswith(":" + SECRET)


def user_id(ctx: CallContext) -> str:
    """The calling user, from the bus entry's context only (never the body)."""
    return checked_user(ctx.context.get("user_id"))


def checked_user(user: object) -> str:
    """The context's `user_id`, which must be non-empty text without ':'."""
    if not isinstance(user, str) or not user:
        raise InvalidContext(
            "context.user_id: a private namespace (in_global_ns false) is "
            "<user_id>:<namespace>, so the bus entry's context must carry user_id as non-empty "
            f"text; got {user!r:.100}", {"path": "context.user_id"})
    if ":" in user:
        # User "a:b" with namespace "c" would be user "a" with namespace "b:c".
        raise InvalidContext(f"context.user_id: must not contain ':' (it ends the user's part "
                             f"of <user_id>:<namespace>), got {user!r:.100}",
                             {"path": "context.user_id"})
    return user


def resolve(settings: Settings, ctx: CallContext, req: NamespaceRequest) -> str:
    """The namespace actually used, which is the native scope: `<user_id>:<namespace>`, or
    `<namespace>` with in_global_ns. Secret namespaces are refused, before the user is even
    looked at: the given name is checked, which is the whole check, since
    `<user_id>:<namespace>` is `secret` or ends in `:secret` exactly when the given name is
    (`<user_id>` holds no ':'). Each resolution is checked once and cached (a function of
    its arguments; an error is raised again each time, never cached)."""
    user = None if req.in_global_ns else ctx.context.get("user_id")
    if not (user is None or type(user) is str) or \
            len(req.namespace) + len(user or "") > CACHED_CHARS:  # (not text: refused later)
        return _resolved.__wrapped__(req.namespace, req.in_global_ns, user,
                                     settings.max_key_bytes)
    return _resolved(req.namespace, req.in_global_ns, user, settings.max_key_bytes)


@functools.lru_cache(maxsize=4096)
def _resolved(namespace: str, in_global_ns: bool, user: object, limit: int) -> str:
    if is_secret(namespace):
        raise ReservedNamespace(
            f"namespace {namespace!r:.100} is reserved: `secret` and `<user_id>:secret` "
            "hold secrets, which the state activities never read or write (use the Secret "
            "Activities)", {"path": "$.namespace", "namespace": namespace})
    resolved = namespace if in_global_ns else f"{checked_user(user)}:{namespace}"
    validate.sized_text("namespace", namespace, limit, KeyTooLong)
    size = len(resolved.encode())
    if size > limit:
        raise KeyTooLong(f"namespace resolves to {resolved!r:.100} ({size} bytes with its "
                         f"`<user_id>:`), more than the limit of {limit} bytes",
                         {"path": "$.namespace", "size": size, "limit": limit})
    return resolved
