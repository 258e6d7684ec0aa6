"""state::release-namespace against real Redis (release.lua): the owner gives scopes back to
the public with their entries, a non-owner is FORBIDDEN, an unclaimed scope is INVALID_SCOPE,
all or nothing; an admin's `force`; the claims cache applies a release idempotently."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.context import CallContext
from stateworker.state import functions
from stateworker.state.core.registry import RegistryEntry
from tests.calls import principal, refuses

pytestmark = pytest.mark.anyio


async def release(store: StateStore, scopes: Any, caller: str | None, **more: Any) -> Any:
    return await store.call("state::release-namespace", {"scopes": scopes, **more},
                            caller=caller)


async def release_error(store: StateStore, scopes: Any, caller: str | None,
                        **more: Any) -> StateError:
    with pytest.raises(StateError) as caught:
        await release(store, scopes, caller, **more)
    return caught.value


async def owners(store: StateStore) -> dict[str, str]:
    """The claims as Redis holds them (and this replica's cache agrees)."""
    flat = await store.state.conn.execute("HGETALL", store.state.keys.claims)
    held = {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
    assert {s: store.state.claims.owner(s) for s in store.state.claims.scopes} == held
    return held


async def claims_entries(store: StateStore) -> list[dict[str, str]]:
    entries = await store.state.conn.execute("XRANGE", store.state.keys.registry, "-", "+")
    found = [{k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
             for _, flat in entries]
    return [e for e in found if e["kind"] == "claims"]


async def test_a_release_writes_one_registry_entry_per_scope(store: StateStore,
                                                             scope: str) -> None:
    await store.claim_namespace("billing", [scope + "-a", scope + "-b", scope + "-kept"])
    before = len(await claims_entries(store))
    await release(store, [scope + "-a", scope + "-b"], "billing")
    entries = (await claims_entries(store))[before:]
    assert [msgspec.json.decode(e["released"]) for e in entries] == [
        {scope + "-a": "billing"}, {scope + "-b": "billing"}]
    assert all(e["by"] == "billing" for e in entries)


async def test_the_owner_releases_and_the_scope_is_public_with_its_entries(
        store: StateStore, scope: str) -> None:
    await store.claim_namespace("billing", [scope, scope + "-kept"])
    await store.call("billing::state::compare-and-set",
                     {"scope": scope, "key": "k", "value": {"kept": True}})
    assert await refuses(store, scope)
    result = await release(store, [scope], "billing")
    assert result == {"released": [scope], "scopes": [scope + "-kept"]}
    assert not await refuses(store, scope)
    assert await store.get(scope, "k") == {"kept": True}
    assert await store.list_groups() == [scope]
    assert await owners(store) == {scope + "-kept": "billing"}
    assert [e.type for e in await store.events(scope)] == ["state:created"]  # none for a release
    *_, entry = await claims_entries(store)
    assert msgspec.json.decode(entry["released"]) == {scope: "billing"}
    assert entry["by"] == "billing"
    await store.set(scope, "k", 2)  # a public write again
    with pytest.raises(StateError) as gone:
        await store.call("billing::state::get", {"scope": scope, "key": "k"})
    assert gone.value.code == "INVALID_SCOPE"  # no longer the namespace's own
    # the last scope released: the namespace has no accessors any more
    assert await store.release_namespace([scope + "-kept"], caller="billing") == {
        "released": [scope + "-kept"], "scopes": []}
    with pytest.raises(StateError) as unknown:
        await store.call("billing::state::get", {"scope": scope + "-kept", "key": "k"})
    assert unknown.value.code == "UNKNOWN_FUNCTION"


async def test_a_released_scope_in_use_is_not_claimable_again_without_adopting(
        store: StateStore, scope: str) -> None:
    await store.claim_namespace("billing", [scope])
    await store.call("billing::state::compare-and-set", {"scope": scope, "key": "k", "value": 1})
    await store.release_namespace([scope], caller="billing")
    with pytest.raises(StateError) as busy:
        await store.claim_namespace("mallory", [scope])
    assert busy.value.code == "SCOPE_IN_USE"


async def test_a_non_owner_is_forbidden_and_nothing_is_released(store: StateStore,
                                                                scope: str) -> None:
    await store.claim_namespace("billing", [scope + "-a"])
    await store.claim_namespace("orders", [scope + "-b"])
    error = await release_error(store, [scope + "-b", scope + "-a"], "orders")
    assert error.code == "FORBIDDEN"
    assert error.details == {"path": "$.scopes", "scope": scope + "-a", "owner": "billing",
                             "caller": "orders"}
    assert '"billing"' in error.message and '"orders"' in error.message
    assert await owners(store) == {scope + "-a": "billing", scope + "-b": "orders"}
    assert len(await claims_entries(store)) == 2  # the two claims: no release entry
    assert await refuses(store, scope + "-b")  # all or nothing


async def test_a_scope_nobody_claimed_is_invalid_scope_naming_it(store: StateStore,
                                                                 scope: str) -> None:
    await store.claim_namespace("billing", [scope])
    error = await release_error(store, [scope, scope + "-public"], "billing")
    assert error.code == "INVALID_SCOPE"
    assert error.details == {"path": "$.scopes", "scope": scope + "-public"}
    assert json.dumps(scope + "-public") in error.message and "not claimed" in error.message
    assert await owners(store) == {scope: "billing"}


@pytest.mark.parametrize(("scopes", "caller", "code", "path"), [
    ([], "billing", "INVALID_SCOPE", "$.scopes"), ([""], "billing", "INVALID_SCOPE", "$.scopes[0]"),
    (["ok", 1], "billing", "INVALID_SCOPE", "$.scopes[1]"),
    (["s" * 1025], "billing", "KEY_TOO_LONG", "$.scopes[0]"),
    (["state_barrier"], "billing", "RESERVED_SCOPE", "$.scopes[0]"),
    (["ok"], None, "UNKNOWN_CALLER", "caller"),
])
async def test_bad_requests_are_refused_before_anything(store: StateStore, scopes: Any,
                                                        caller: str | None, code: str,
                                                        path: str) -> None:
    await store.claim_namespace("billing", ["ok"])
    error = await release_error(store, scopes, caller)
    assert error.code == code and error.details["path"] == path
    assert await owners(store) == {"ok": "billing"}


async def test_an_admin_releases_any_namespaces_scopes_with_force_and_it_is_logged(
        store: StateStore, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    await store.claim_namespace("billing", [scope + "-a"])
    await store.claim_namespace("orders", [scope + "-b"])
    with caplog.at_level("INFO", logger="stateworker.state.tenancy.namespaces"):
        result = await release(store, [scope + "-a", scope + "-b"], "ops", force=True)
    assert result == {"released": [scope + "-a", scope + "-b"], "scopes": []}
    assert await owners(store) == {}
    (line,) = [r for r in caplog.records if getattr(r, "event", "") == "claims.forced_release"]
    assert line.released == {scope + "-a": "billing", scope + "-b": "orders"}  # type: ignore[attr-defined]
    assert '"ops"' in line.getMessage()
    assert not await refuses(store, scope + "-a") and not await refuses(store, scope + "-b")


async def test_in_acl_mode_the_releaser_is_the_principal_and_force_needs_an_admin(
        store: StateStore, scope: str) -> None:
    await store.claim_namespace("billing", [scope])
    for name in ("mallory", "billing"):
        await principal(store, name, allow=("claims",))

    async def as_principal(principal: str, body: dict[str, Any]) -> Any:
        ctx = CallContext(principal=principal, caller="billing")  # the field counts for nothing
        raw = await functions.call_json(store.state, "state::release-namespace",
                                        msgspec.json.encode(body), ctx, store.catalog)
        return msgspec.json.decode(raw)

    for body, code in (({"scopes": [scope]}, "FORBIDDEN"),
                       ({"scopes": [scope], "force": True}, "PERMISSION_DENIED")):
        with pytest.raises(StateError) as caught:
            await as_principal("mallory", body)
        assert caught.value.code == code
        assert caught.value.details.get("caller", caught.value.details.get("principal")) \
            == "mallory"
    assert await owners(store) == {scope: "billing"}
    assert await as_principal("billing", {"scopes": [scope]}) == {"released": [scope],
                                                                  "scopes": []}


# ---- the claims cache -----------------------------------------------------------------------
async def test_applying_a_release_is_idempotent_and_leaves_a_later_claim_alone(
        store: StateStore, scope: str) -> None:
    claims = store.state.claims

    def entry(**fields: str) -> RegistryEntry:
        return RegistryEntry("1-1", "claims", {"kind": "claims", **fields})

    claim_a = entry(prefix="billing", scopes=msgspec.json.encode([scope]).decode())
    release_a = entry(released=msgspec.json.encode({scope: "billing"}).decode(), by="billing")
    claim_b = entry(prefix="orders", scopes=msgspec.json.encode([scope]).decode())
    await claims.apply(claim_a)
    await claims.apply(release_a)
    await claims.apply(release_a)  # again (after a reload): still released
    assert not claims.is_claimed(scope) and not claims.owns_any("billing")
    await claims.apply(claim_b)
    await claims.apply(release_a)  # an old release applied again over a newer claim
    assert claims.owner(scope) == "orders"
    assert scope in claims.scopes
    await claims.reload()  # back to what Redis holds (nothing: the entries were made up)
