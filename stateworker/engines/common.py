"""What every engine's front-end needs: native errors named in the engine's own terms."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from stateworker.errors import StateError


@contextmanager
def renamed(native: str, field: str) -> Iterator[None]:
    """A native check names its own field (`scope`); the engine's caller sent `field`
    (`namespace`): the same error, named as sent (a claimed scope's RESERVED_SCOPE ...)."""
    try:
        yield
    except StateError as exc:
        if exc.details.get("path") != f"$.{native}":
            raise
        message = exc.message.replace(f"$.{native}", f"$.{field}", 1) \
            if exc.message.startswith("$.") else exc.message.replace(native, field, 1)
        raise type(exc)(message, {**exc.details, "path": f"$.{field}"}) from exc
