"""Every error that leaves the service, each with a stable code (`ERROR_CLASSES` maps a code
read off the bus back to its class, `error_from`; `register` adds a class defined elsewhere).
What a code is outside Python, its HTTP status and its section of docs/errors.md, is
error_codes.py's. The statuses the Lua scripts return, and which of them are errors, are the
scripts layer's (scripts/statuses.py).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import msgspec

from stateworker.error_codes import HTTP_STATUS


def shown(value: object) -> str:
    """A value in a message as the caller wrote it: JSON text (`null`, `"orders"`, `[1,2]`),
    never a Python repr (`None`, `'orders'`). What JSON cannot hold shows as its JSON string."""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError, msgspec.EncodeError):  # (a lone surrogate: escaped)
        return json.dumps(str(value))


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest to `name` (a misspelling's: a field, a command, a function),
    or None when none is close."""
    import difflib  # (with heapq: only for a misspelling, not in every command's start)

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


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


class UnknownField(InvalidRequest):
    """Raised when a request names a field its function does not take (a misspelt option
    would otherwise be dropped without a word); `details.path` is the field's, and
    `details.nearest` the known field nearest to it (null when none is close). An
    INVALID_REQUEST to code that catches that class."""

    code = "UNKNOWN_FIELD"


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


class CallTooLarge(StateError):
    """Raised when one call would read and write more bytes of values than `max_call_bytes`
    (a transaction, set-many or delete-many over many large values): nothing was written."""

    code = "CALL_TOO_LARGE"


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


class StoreLost(StateError):
    """A write or a read met a Redis that lost the data PostgreSQL holds (its generation
    marker gone or another), or one a restore writes back (a read: `store_lost_read`); nothing
    was written. Not an Unavailable: the call certainly did not run, so it is answered at
    once (a bus call left pending would wait for a recovery that may take hours)."""

    code = "STORE_LOST"


STORE_LOST_TEXT = (
    "Redis has lost the data this service keeps (its generation marker is gone or is not the "
    "one PostgreSQL holds: a FLUSHALL, a restart without its AOF, an eviction, or a Redis "
    "behind the snapshot); nothing was written, and writes are refused until it is "
    "recovered: run `stateworker restore` (it rebuilds Redis from the PostgreSQL snapshot), "
    "or, with no snapshot, restart the service to begin the data anew")


def store_lost_read(prefix: str, restoring: bool) -> StoreLost:
    """A read refused where Redis does not hold the prefix's data whole (lost, restoring)."""
    why = ("a restore of it is running (`stateworker restore`): retry the read once it ends"
           if restoring else "Redis lost its data (a FLUSHALL, a restart without its AOF, an "
           "eviction, a Redis behind the snapshot): run `stateworker restore`, or, with no "
           "snapshot, the service begins the data anew by itself")
    return StoreLost(f"the data of prefix {shown(prefix)} is not in Redis whole, so a key it "
                     f"lacks would read as missing; reads and writes are refused: {why}",
                     {"prefix": prefix, "restoring": restoring, "recover": "stateworker restore"})


class RestoreRefused(StateError):
    """Raised when `stateworker restore` finds a Redis that still holds entries of the prefix
    (a restore rebuilds, it does not merge); nothing was written."""

    code = "RESTORE_REFUSED"


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
    """Raised when a call that needs the caller's identity (claim-namespace, release-namespace,
    list_entries) carries none."""

    code = "UNKNOWN_CALLER"


class InvalidCursor(StateError):
    """Raised when `state::list_entries`' cursor is not a live one of this listing: unknown,
    tampered, expired, already read, or issued for another scope, caller, limit or
    max_bytes (which of these is not said: a cursor reveals nothing)."""

    code = "INVALID_CURSOR"


class SnapshotCapacity(StateError):
    """Raised when `state::list_entries` would keep a snapshot past its bounds: the live
    snapshots of a partition, the entries of one, or its bytes (`max_call_bytes`)."""

    code = "SNAPSHOT_CAPACITY"


class RowTooLarge(StateError):
    """Raised when `state::list_entries`' next entry cannot fit a page of `max_bytes` on its
    own: it is never skipped (nothing read is consumed)."""

    code = "ROW_TOO_LARGE"


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


class ScopeInUse(StateError):
    """Raised when a namespace claims a public scope that is in use (it holds entries, a
    trigger names it, or it was written within the dedupe window) without an admin's
    `adopt: true`; nothing is claimed."""

    code = "SCOPE_IN_USE"


class PermissionDenied(StateError):
    """Raised in `acl` mode when the calling principal's roles do not grant the function on
    the scope (or let it act as the user its context names); the message names the
    principal, the function, the scope and the missing grant."""

    code = "PERMISSION_DENIED"


class DuplicateKey(StateError):
    """Raised when a transaction writes one key twice (as etcd refuses it): which write wins
    would be a guess; `details` names the key and both ops."""

    code = "DUPLICATE_KEY"


class OpFailed(StateError):
    """Raised when an update op inside a transaction cannot apply; its code is the op's
    (`increment.not_number` ...: docs/errors.md), so nothing of the transaction was written."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, details)
        self.code = code  # type: ignore[misc]


class ConfigError(Exception):
    """Raised at start when settings or the Redis server are unfit (AOF off, bad URL, ...)."""


class LayoutMismatch(ConfigError, StateError):
    """Raised at start when a setting differs from what the prefix's data was laid out with
    (the partition count), or from what its live services serve with, or would leave calls
    the bus holds unserved (where the bus is, its shards); nothing was written.
    `details`: `setting` (its field name), `stored`, `given`, `prefix`. A ConfigError too,
    so every start that refuses a setting refuses it the same way (the command: status 2)."""

    code = "LAYOUT_MISMATCH"


class MissingPermission(ConfigError):
    """Raised at start when the service's Redis user lacks part of the service's ACL rule
    (docs/security.md); the message is one line naming what it lacks."""


class ScriptError(Exception):
    """Raised when a Lua file or one of its includes cannot be assembled, or Redis refuses
    to load the library (the reason named)."""


ERROR_CLASSES: dict[str, type[StateError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest, UnknownField, KeyTooLong, ValueTooLarge, CallTooLarge, Conflict, NotFound,
        ReservedScope, UnknownFunction, Unavailable, StoreLost, RestoreRefused, LayoutMismatch,
        DeadlineExceeded, InternalError, CallTimeout, CallIdReused, ResourceExhausted,
        BarrierConfig, InvalidPrefix, InvalidScope, Forbidden, UnknownCaller, ScopeConflict,
        Compacted, KeyLimit, InvalidContext, ScopeInUse, PermissionDenied, DuplicateKey,
        InvalidCursor, SnapshotCapacity, RowTooLarge,
    )
}

E = TypeVar("E", bound=StateError)


def register(http_status: int) -> Callable[[type[E]], type[E]]:
    """A class decorator: map `cls.code` back to `cls` in `error_from`, and give the code its
    HTTP status, for an error class of its own outside this module (an engine's: moco's
    ReservedNamespaceError, engines/moco/rules.py). `stateworker/__init__.py` names every
    such class's module in ERROR_HOMES, so every process's clients know it."""
    def registered(cls: type[E]) -> type[E]:
        if ERROR_CLASSES.setdefault(cls.code, cls) is not cls:
            raise ValueError(f"error code {shown(cls.code)} is "
                             f"{ERROR_CLASSES[cls.code].__name__}'s already")
        HTTP_STATUS[cls.code] = http_status
        return cls

    return registered


# The codes whose class is defined (and registered) outside this module, and that module:
# error_from imports it at the first such reply, so a process that never imported the engines
# (a client; a short command, which must start fast) still raises their classes.
ERROR_HOMES: dict[str, str] = {}


def error_from(code: str, message: str, details: dict[str, Any] | None = None) -> StateError:
    """The exception for an error reply (`{code, message, details}`) read off the bus."""
    cls = ERROR_CLASSES.get(code)
    if cls is None and code in ERROR_HOMES:
        importlib.import_module(ERROR_HOMES[code])  # (its `register` adds the class)
        cls = ERROR_CLASSES.get(code)
    return cls(message, details) if cls is not None else RemoteError(code, message, details)


