"""What the tests that call state functions share: a scope's events as tuples, the
StateError a call raises, and an update that increments `n`."""

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
