"""What every engine's front-end needs: native errors named in the engine's own terms."""

from __future__ import annotations

from types import TracebackType
from typing import NoReturn

from stateworker.errors import StateError


def renamed_error(exc: StateError, native: str, field: str) -> StateError:
    """`exc` named as the engine's caller sent it: a native check names its own field
    (`scope`), the caller sent `field` (`namespace`). `exc` itself when it names another.
    A detail of the native error already called `field` is kept as `claimed_by`: it is the
    claimant of a claimed scope (RESERVED_SCOPE), which the caller would read as its own."""
    if exc.details.get("path") != f"$.{native}":
        return exc
    message = exc.message.replace(f"$.{native}", f"$.{field}", 1) \
        if exc.message.startswith("$.") else exc.message.replace(native, field, 1)
    details = dict(exc.details)
    if field in details:
        details["claimed_by"] = details.pop(field)
    return type(exc)(message, {**details, "path": f"$.{field}"})


def raise_as_namespace(exc: StateError) -> NoReturn:
    """Raise `exc` with a native scope's error named as the engine's namespace (a claimed
    scope's RESERVED_SCOPE, a scope too long ...). For an `except StateError` around a
    native call on an engine's hot path, where a `with renamed(...)` costs two calls."""
    named = renamed_error(exc, "scope", "namespace")
    if named is exc:
        raise exc
    raise named from exc


class _Renamed:
    """The context manager `renamed` gives (a class, not a generator: it wraps a native
    call on every engine call, and costs a third of a generator-based one)."""

    __slots__ = ("field", "native")

    def __init__(self, native: str, field: str) -> None:
        self.native, self.field = native, field

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if not isinstance(exc, StateError):
            return
        named = renamed_error(exc, self.native, self.field)
        if named is not exc:
            raise named from exc


def renamed(native: str, field: str) -> _Renamed:
    """A native check names its own field (`scope`); the engine's caller sent `field`
    (`namespace`): the same error, named as sent (a claimed scope's RESERVED_SCOPE ...)."""
    return _Renamed(native, field)


# The rename every engine needs (a native scope is an engine's namespace): one instance,
# as `_Renamed` holds no state of a call.
SCOPE_AS_NAMESPACE = renamed("scope", "namespace")
