"""What every engine's front-end needs: native errors named in the engine's own terms."""

from __future__ import annotations

from types import TracebackType

from stateworker.errors import StateError


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
        if not isinstance(exc, StateError) or exc.details.get("path") != f"$.{self.native}":
            return
        native, field = self.native, self.field
        message = exc.message.replace(f"$.{native}", f"$.{field}", 1) \
            if exc.message.startswith("$.") else exc.message.replace(native, field, 1)
        raise type(exc)(message, {**exc.details, "path": f"$.{field}"}) from exc


def renamed(native: str, field: str) -> _Renamed:
    """A native check names its own field (`scope`); the engine's caller sent `field`
    (`namespace`): the same error, named as sent (a claimed scope's RESERVED_SCOPE ...)."""
    return _Renamed(native, field)
