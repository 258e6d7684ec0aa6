"""What the tests that call state functions share: a scope's events as tuples, the
StateError a call raises, an update that increments `n`, whether a claimed scope is refused."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore

INCREMENT = [{"type": "increment", "path": "n", "by": 1}]


async def events(store: StateStore, scope: str) -> list[tuple[str, str, Any, Any, int]]:
    return [
        (e.type, e.key, msgspec.json.decode(e.old_value), msgspec.json.decode(e.new_value),
         e.version)
        for e in await store.events(scope)
    ]


async def error_of(store: StateStore, fn: str, body: Any) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body)
    return caught.value


async def refuses(store: StateStore, scope: str) -> bool:
    """The public functions refuse `scope` (a private namespace claimed it)."""
    try:
        await store.call("state::get", {"scope": scope, "key": "k"})
    except StateError as exc:
        assert exc.code == "RESERVED_SCOPE", exc
        return True
    return False
