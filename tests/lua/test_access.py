"""access.lua, through state/tenancy/principals.py: each return code, the registry entry of every
change (and none for a refusal or a del of what is absent), and nothing written before the
checks."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateStore
from stateworker.errors import Conflict, NotFound
from stateworker.state.tenancy import principals

pytestmark = pytest.mark.anyio


async def registry(store: StateStore) -> list[dict[str, Any]]:
    entries = await store.state.conn.execute("XRANGE", store.state.keys.registry, "-", "+")
    return [{k.decode(): v.decode() for k, v in zip(f[::2], f[1::2], strict=True)}
            for _, f in entries]


async def test_every_change_is_written_with_its_registry_entry(store: StateStore) -> None:
    state = store.state
    role, replaced = await principals.add_role(state, "ops", ["read"], ["a/*"], True, ["s"])
    assert not replaced
    assert (await principals.add_role(state, "ops", ["write"], ["*"], False, []))[1]
    record = await principals.add_principal(state, "bob", ["ops", "reader"], ["t-*"])
    assert await principals.remove_principal(state, "bob")
    assert not await principals.remove_principal(state, "bob")  # absent: nothing written
    assert await principals.remove_role(state, "ops")
    assert not await principals.remove_role(state, "ops")
    entries = await registry(store)
    assert [(e["kind"], e["name"], bool(e["record"])) for e in entries] == [
        ("roles", "ops", True), ("roles", "ops", True), ("principals", "bob", True),
        ("principals", "bob", False), ("roles", "ops", False)]
    assert msgspec.json.decode(entries[0]["record"])["scopes"] == list(role.scopes)
    assert msgspec.json.decode(entries[2]["record"])["act_as"] == list(record.act_as)
    assert await state.conn.execute("HLEN", state.keys.principals) == 0
    assert await state.conn.execute("HLEN", state.keys.roles) == 0


async def test_refusals_write_nothing(store: StateStore) -> None:
    state = store.state
    await principals.add_role(state, "ops", ["read"], ["*"], False, [])
    await principals.add_principal(state, "bob", ["ops"], [])
    before = await registry(store)
    with pytest.raises(Conflict) as exists:
        await principals.add_principal(state, "bob", ["reader"], [])
    assert exists.value.details == {"name": "bob"}
    with pytest.raises(NotFound) as no_role:
        await principals.add_principal(state, "ann", ["reader", "nope"], [])
    assert no_role.value.details == {"role": "nope"}
    with pytest.raises(Conflict) as in_use:
        await principals.remove_role(state, "ops")
    assert in_use.value.details == {"role": "ops", "principal": "bob"}
    assert await registry(store) == before
    assert await state.conn.execute("HKEYS", state.keys.principals) == [b"bob"]
    assert await state.conn.execute("HKEYS", state.keys.roles) == [b"ops"]
    held = msgspec.json.decode(await state.conn.execute("HGET", state.keys.principals, "bob"))
    assert held["roles"] == ["ops"]
