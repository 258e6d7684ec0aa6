"""What the tests that call state functions share: a scope's events as tuples, the
StateError a call raises, an update that increments `n`, whether a claimed scope is refused."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.state import principals

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


async def principal(store: StateStore, name: str, *roles: str, act_as: tuple[str, ...] = (),
                    allow: tuple[str, ...] = (), services: tuple[str, ...] = ()) -> None:
    """`acl` mode's principal `name` in the store's prefix, for in-process calls made with
    `CallContext(principal=name)` (no Redis user: nothing connects as it). `allow`: a role of
    its own granting those families on every scope (and `services` as trigger targets)."""
    if allow:
        await principals.add_role(store.state, f"{name}-role", list(allow), ["*"], False,
                                  list(services))
        roles = (*roles, f"{name}-role")
    await principals.add_principal(store.state, name, list(roles), list(act_as))
