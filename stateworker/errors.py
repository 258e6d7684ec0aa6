"""Every error that leaves the service, each with a stable code.

The Lua scripts return a small integer status as the first element of their reply. `LUA_STATUS`
is the one table of those statuses: `scripts.py` writes it into every script as the Lua table
`ST`, so Lua and Python cannot disagree, and `tests/unit/test_errors.py` checks that every `ST.X`
a script names exists here.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, ClassVar


class StateError(Exception):
    """Raised for any failed state function call; `code` is stable, `message` names the field."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class InvalidRequest(StateError):
    """Raised when a request field is missing, of the wrong type or out of range."""

    code = "INVALID_REQUEST"


class CallIdReused(StateError):
    """Raised when a bus call id that was recorded for one call comes with another function or
    body (ids are unique per logical call; a retry repeats the same call)."""

    code = "CALL_ID_REUSED"


class KeyTooLong(StateError):
    """Raised when a scope or key is longer than `max_key_bytes` UTF-8 bytes."""

    code = "KEY_TOO_LONG"


class ValueTooLarge(StateError):
    """Raised when a value's compact JSON is longer than `max_value_bytes`."""

    code = "VALUE_TOO_LARGE"


class Conflict(StateError):
    """Raised when `expected_version` or `create_only` does not match the stored version."""

    code = "CONFLICT"


class NotFound(StateError):
    """Raised when `required: true` is asked of a missing entry."""

    code = "NOT_FOUND"


class ReservedScope(StateError):
    """Raised when a public function names a scope the service keeps for itself."""

    code = "RESERVED_SCOPE"


class UnknownFunction(StateError):
    """Raised when a call names a function id that the service does not serve."""

    code = "UNKNOWN_FUNCTION"


class Unavailable(StateError):
    """Raised when Redis cannot be reached or answered with an error the caller cannot fix."""

    code = "UNAVAILABLE"


class DeadlineExceeded(StateError):
    """Raised when a call's `deadline_ms` passed before it could run, or a worker function ran
    longer than its `timeout`."""

    code = "DEADLINE_EXCEEDED"


def deadline_text(deadline_ms: int | None) -> tuple[str, dict[str, Any]]:
    """Message and details of the one DEADLINE_EXCEEDED of every path (bus, plans, scripts)."""
    return (f"deadline_ms {deadline_ms} passed before the call ran; nothing was written",
            {"deadline_ms": deadline_ms})


def deadline_exceeded(deadline_ms: int | None) -> DeadlineExceeded:
    return DeadlineExceeded(*deadline_text(deadline_ms))


class ResourceExhausted(StateError):
    """Raised when Redis refuses a write because it reached its memory limit (`maxmemory`)."""

    code = "RESOURCE_EXHAUSTED"


class InternalError(StateError):
    """Raised when the service itself failed; the message says where."""

    code = "INTERNAL"


class CallTimeout(StateError):
    """Raised by a client when no reply came within the timeout, after every retry."""

    code = "TIMEOUT"


class RemoteError(StateError):
    """Raised by a client for an error code it has no class of its own for."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.code = code  # type: ignore[misc]


class BarrierConfig(StateError):
    """Raised when `state::barrier`'s `condition_config` is missing or bad (or differs from
    the barrier's first arrival)."""

    code = "BARRIER_CONFIG"


class InvalidPrefix(StateError):
    """Raised when a namespace's `functions_prefix` is not `[A-Za-z0-9_-]+`."""

    code = "INVALID_PREFIX"


class InvalidScope(StateError):
    """Raised when a claimed scope is empty or not a string, or an accessor is called on a
    scope its namespace does not own."""

    code = "INVALID_SCOPE"


class Forbidden(StateError):
    """Raised when a worker claims a namespace that is not its own name."""

    code = "FORBIDDEN"


class UnknownCaller(StateError):
    """Raised when a call that needs the caller's identity (claim-namespace) carries none."""

    code = "UNKNOWN_CALLER"


class ScopeConflict(StateError):
    """Raised when a scope asked for is owned by another namespace (nothing is claimed)."""

    code = "SCOPE_CONFLICT"


class Compacted(StateError):
    """Raised to a watch that resumes from a revision older than the oldest one kept."""

    code = "COMPACTED"


class KeyLimit(StateError):
    """Raised when a write would create a key in a scope that already holds `max_keys` live
    keys (KeeperHub's ceiling); nothing is written. Overwriting a key never counts."""

    code = "KEY_LIMIT"


class InvalidContext(StateError):
    """Raised when a call needs a field of its bus `context` that it lacks or that is
    malformed (moco's user-scoped namespaces need `user_id`, Dagu's `dag` scope `dag_name`,
    an isolated native call `org_id` and `workflow_id`): isolation comes from the context
    only, never from the body."""

    code = "INVALID_CONTEXT"


class ReservedNamespace(StateError):
    """moco's ReservedNamespaceError: the namespace `secret` or `<anyone>:secret`, which hold
    secrets, named to a `builtin.state.*` function. The code is moco's own class name, so a
    moco caller catches what it always caught (the Python client raises this class)."""

    code = "ReservedNamespaceError"


ReservedNamespaceError = ReservedNamespace  # moco's name for it


class ConfigError(Exception):
    """Raised at start when settings or the Redis server are unfit (AOF off, bad URL, ...)."""


class ScriptError(Exception):
    """Raised when a Lua file or one of its includes cannot be assembled, or Redis refuses
    to load the library (the reason named)."""


ERROR_CLASSES: dict[str, type[StateError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        KeyTooLong,
        ValueTooLarge,
        Conflict,
        NotFound,
        ReservedScope,
        UnknownFunction,
        Unavailable,
        DeadlineExceeded,
        InternalError,
        CallTimeout,
        CallIdReused,
        ResourceExhausted,
        BarrierConfig,
        InvalidPrefix,
        InvalidScope,
        Forbidden,
        UnknownCaller,
        ScopeConflict,
        Compacted,
        KeyLimit,
        InvalidContext,
        ReservedNamespace,
    )
}


def error_from(code: str, message: str, details: dict[str, Any] | None = None) -> StateError:
    """The exception for an error reply (`{code, message, details}`) read off the bus."""
    cls = ERROR_CLASSES.get(code)
    return cls(message, details) if cls is not None else RemoteError(code, message, details)


# ---- callers' messages (StateClient, Worker, the CLI) -------------------------------------------
HOW_TO_START = ("Start it with ./scripts/run, or set STATEWORKER_REDIS_URL (--redis-url) to "
                "the Redis it uses")


def shown_url(url: str) -> str:
    """A URL as messages, logs and `status` show it: a password in it replaced by `***`."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def no_redis_text(url: str, reason: object) -> str:
    """One line for a Redis that cannot be reached: where, why, and how to get one."""
    return f"no Redis at {shown_url(url)} ({reason}): is the service running? {HOW_TO_START}"


def timeout_text(fn: str, call_id: str, timeout_s: float, sends: int, deadline_ms: int,
                 when: str) -> tuple[str, dict[str, Any]]:
    """Message and details of a client's TIMEOUT for a call sent with `deadline_ms` (`when`:
    the same time as RFC 3339): whether it may still be applied, how to learn its outcome."""
    return (f"{fn}: no reply within {timeout_s:g} s (call id {call_id!r}, sent {sends} "
            f"time(s)). It carries deadline_ms {deadline_ms} ({when}): the service starts it "
            f"only before then, so it is applied by {when} or never (a state::* call applies "
            "in one step; a worker function started in time may still be running). A call with "
            "the same id returns its outcome (its recorded reply; with the same deadline_ms, "
            "DEADLINE_EXCEEDED when it never ran).",
            {"call_id": call_id, "deadline_ms": deadline_ms, "may_be_applied_until": when})


def not_sent_text(fn: str, call_id: str, url: str, timeout_s: float,
                  reason: object) -> tuple[str, dict[str, Any]]:
    """Message and details of a client's UNAVAILABLE for a call that never reached the
    stream: it will never be applied."""
    return (f"{fn}: not sent within {timeout_s:g} s: Redis at {shown_url(url)} was unavailable ({reason}); "
            f"the call (id {call_id!r}) never reached the bus and will not be applied",
            {"call_id": call_id, "sent": False, "reason": str(reason)[:200]})
