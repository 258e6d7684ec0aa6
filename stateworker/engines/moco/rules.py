"""moco's rules: a request decoded with moco's texts (the field at fault named, unknown
fields refused), `limit` / `offset`, and namespaces: `<user_id>:<namespace>` or
`<namespace>` (which is the native scope), the user from the call's context, secret
namespaces refused with moco's own error.
"""

from __future__ import annotations

import functools
import re
from typing import TypeVar

import msgspec
from msgspec import Struct

from stateworker import codec
from stateworker.context import CallContext
from stateworker.engines.moco.schemas import NamespaceRequest
from stateworker.errors import (
    InvalidContext,
    InvalidRequest,
    KeyTooLong,
    StateError,
    UnknownField,
    register,
    shown,
)
from stateworker.settings import Settings
from stateworker.state.core import validate

SECRET = "secret"  # moco keeps secrets in the same table, under `secret` and `<user_id>:secret`
CACHED_CHARS = 1024  # longer namespace + user id: resolved each time (memory: dagu/rules.py)


@register(403)  # (a client raises this class for its code: errors.error_from; HTTP 403)
class ReservedNamespace(StateError):
    """moco's ReservedNamespaceError: the namespace `secret` or `<anyone>:secret`, which hold
    secrets, named to a `builtin.state.*` function. The code is moco's own class name, so a
    moco caller catches what it always caught (the Python client raises this class)."""

    code = "ReservedNamespaceError"


ReservedNamespaceError = ReservedNamespace  # moco's name for it


# ---- decoding ---------------------------------------------------------------------------------
R = TypeVar("R", bound=Struct)
_MISSING = re.compile(r"^\$\.([^.\[]+): the field `\1` is required$", re.DOTALL)


def request(fn: str, body: bytes, type_: type[R]) -> R:
    """The body as `type_`; INVALID_REQUEST with the path of the field at fault (a missing
    one named with the function that requires it); an unknown field is UNKNOWN_FIELD naming
    the nearest known one and the function's fields."""
    try:
        return validate.request(body, type_)
    except UnknownField as exc:
        fields = [f.encode_name for f in msgspec.structs.fields(type_)]
        raise validate.unknown_field("$", exc.details["path"][2:], fields,
                                     f"{fn} takes only") from exc
    except InvalidRequest as exc:
        missing = _MISSING.match(exc.message)
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
            f"text; got {shown(user)[:100]}", {"path": "context.user_id"})
    if ":" in user:
        # User "a:b" with namespace "c" would be user "a" with namespace "b:c".
        raise InvalidContext(f"context.user_id: must not contain ':' (it ends the user's part "
                             f"of <user_id>:<namespace>), got {shown(user)[:100]}",
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
            f"namespace {shown(namespace)[:100]} is reserved: `secret` and `<user_id>:secret` "
            "hold secrets, which the state activities never read or write (use the Secret "
            "Activities)", {"path": "$.namespace", "namespace": namespace})
    resolved = namespace if in_global_ns else f"{checked_user(user)}:{namespace}"
    codec.sized_text("namespace", namespace, limit, KeyTooLong)
    size = len(resolved.encode())
    if size > limit:
        raise KeyTooLong(f"namespace resolves to {shown(resolved)[:100]} ({size} bytes with its "
                         f"`<user_id>:`), more than the limit of {limit} bytes",
                         {"path": "$.namespace", "size": size, "limit": limit})
    return resolved
