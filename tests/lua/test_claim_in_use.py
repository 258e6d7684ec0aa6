"""Claims that cannot squat (claim.lua and the claim's read step, against real Redis): a
public scope that holds entries, is named by a trigger or was written within the dedupe
window is SCOPE_IN_USE and nothing changes; an admin adopts it with `adopt: true` (logged and
in the registry entry); the `written` record each entry script keeps, and the reaper's
pruning of it; in `acl` mode the claimant is the principal and only an admin adopts."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.state import expiry, functions
from tests.calls import principal, refuses

pytestmark = pytest.mark.anyio


async def claim_error(store: StateStore, body: dict[str, Any], caller: str) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::claim-namespace", body, caller=caller)
    return caught.value


async def registry(store: StateStore) -> list[dict[str, str]]:
    entries = await store.state.conn.execute("XRANGE", store.state.keys.registry, "-", "+")
    return [{k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
            for _, flat in entries]


async def claims_hash(store: StateStore) -> dict[bytes, bytes]:
    flat = await store.state.conn.execute("HGETALL", store.state.keys.claims)
    return dict(zip(flat[::2], flat[1::2], strict=True))


async def written_ms(store: StateStore, scope: str) -> int | None:
    part = store.state.keys.for_scope(scope)
    score = await store.state.conn.execute("ZSCORE", part.written, scope)
    return None if score is None else int(float(score))


async def unchanged(store: StateStore, scope: str, entries: int) -> None:
    """Nothing was claimed: the scope is public, listed, its entries readable; no claim is
    stored and no registry entry written, on this replica or in Redis."""
    assert not await refuses(store, scope)
    assert len(await store.list(scope)) == entries
    assert (scope in await store.list_groups()) is (entries > 0)
    assert await claims_hash(store) == {}
    assert not [e for e in await registry(store) if e["kind"] == "claims"]
    await store.state.claims.reload()
    assert not store.state.claims.is_claimed(scope)


# ---- the hostile trial --------------------------------------------------------------------------
async def test_the_squatting_sequence_is_scope_in_use_and_changes_nothing(
        store: StateStore, scope: str) -> None:
    orders = scope + "-orders"
    await store.call("state::set", {"scope": orders, "key": "o-1", "value": 1})
    error = await claim_error(store, {"functions_prefix": "mallory", "scopes": [orders]},
                              caller="mallory")
    assert error.code == "SCOPE_IN_USE"
    assert error.details["scope"] == orders and error.details["entries"] == 1
    assert error.details["path"] == "$.scopes"
    assert json.dumps(orders) in error.message and "1 entry" in error.message
    assert "adopt" in error.message
    await unchanged(store, orders, 1)
    assert await store.call("state::get", {"scope": orders, "key": "o-1"}) == 1
    assert (await store.call("state::list_groups", {}))["groups"] == [orders]
    with pytest.raises(StateError) as unknown:
        await store.call("mallory::state::get", {"scope": orders, "key": "o-1"})
    assert unknown.value.code == "UNKNOWN_FUNCTION"  # mallory owns nothing


async def test_all_or_nothing_a_free_scope_beside_one_in_use_is_not_claimed(
        store: StateStore, scope: str) -> None:
    await store.set(scope + "-used", "k", 1)
    error = await claim_error(store, {"functions_prefix": "mallory",
                                      "scopes": [scope + "-free", scope + "-used"]}, "mallory")
    assert error.code == "SCOPE_IN_USE" and error.details["scope"] == scope + "-used"
    await unchanged(store, scope + "-free", 0)


async def test_mocos_alice_tasks_cannot_be_squatted(store: StateStore) -> None:
    alice = {"user_id": "alice", "execution_id": "run-a"}
    await store.call("builtin.state.set_state", {"namespace": "tasks", "key": "t-1",
                                                 "value": "hers"}, context=alice)
    error = await claim_error(store, {"functions_prefix": "mallory",
                                      "scopes": ["alice:tasks"]}, "mallory")
    assert error.code == "SCOPE_IN_USE"
    assert error.details["scope"] == "alice:tasks" and error.details["entries"] == 1
    got = await store.call("builtin.state.get_state", {"namespace": "tasks", "key": "t-1"},
                           context=alice)
    assert got == "hers"
    await unchanged(store, "alice:tasks", 1)


async def test_a_scope_named_by_a_trigger_is_in_use_though_it_holds_nothing(
        store: StateStore, scope: str) -> None:
    await store.call("state::register-trigger", {
        "id": "watch-orders", "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": scope}})
    error = await claim_error(store, {"functions_prefix": "mallory", "scopes": [scope]},
                              "mallory")
    assert error.code == "SCOPE_IN_USE"
    assert error.details["entries"] == 0 and '"watch-orders"' in error.message
    await unchanged(store, scope, 0)
    # a trigger on another scope, or on no scope, does not make it in use
    await store.call("state::unregister-trigger", {"id": "watch-orders"})
    await store.call("state::register-trigger", {
        "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": scope + "-other"}})
    await store.call("state::register-trigger", {"function_id": "r::f", "service": "r"})
    assert (await store.claim_namespace("billing", [scope])).claimed


async def test_a_scope_whose_entries_were_all_deleted_within_the_window_is_in_use(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "a", 1)
    await store.set(scope, "b", 2)
    await store.call("state::delete", {"scope": scope, "key": "a"})
    await store.call("state::delete-by-topic", {"scope": scope, "topic_pattern": "*"})
    await store.delete(scope, "b")
    assert await store.list_groups() == []  # nothing left to see
    error = await claim_error(store, {"functions_prefix": "mallory", "scopes": [scope]},
                              "mallory")
    assert error.code == "SCOPE_IN_USE" and error.details["entries"] == 0
    assert "within the dedupe window" in error.message
    await unchanged(store, scope, 0)


async def test_a_scope_last_written_before_the_window_is_free_to_claim(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "k", 1)
    await store.delete(scope, "k")
    # as if the delete were a window ago (the clock is not waited on): the record's score
    part = store.state.keys.for_scope(scope)
    long_ago = now_ms() - store.settings.dedupe_window_ms - 1
    await store.state.conn.execute("ZADD", part.written, long_ago, scope)
    assert (await store.claim_namespace("billing", [scope])).claimed


# ---- the written record -----------------------------------------------------------------
async def test_every_entry_script_records_the_scopes_last_write(store: StateStore,
                                                               scope: str) -> None:
    written = store.state.keys.for_scope(scope).written
    assert await written_ms(store, scope) is None
    start = now_ms()
    await store.set(scope, "k", 1, topic="t")
    assert (await written_ms(store, scope) or 0) >= start
    for fn, body in [
        ("state::update", {"key": "k", "ops": [{"type": "set", "path": "", "value": 2}]}),
        ("state::compare-and-set", {"key": "k", "value": 3, "expected": 2}),
        ("state::diff", {"key": "k", "value": 4}),
        ("state::update-topic", {"key": "k", "topic": "u"}),
        ("state::delete-by-topic", {"topic_pattern": "u"}),
        ("state::set", {"key": "k", "value": 5}), ("state::delete", {"key": "k"}),
    ]:
        await store.state.conn.execute("ZREM", written, scope)  # this call must write it again
        await store.call(fn, {"scope": scope, **body})
        assert await written_ms(store, scope) is not None, fn
    # a call that changes nothing records nothing
    await store.state.conn.execute("ZREM", written, scope)
    await store.call("state::delete", {"scope": scope, "key": "k"})
    assert await written_ms(store, scope) is None


async def test_the_reaper_forgets_only_writes_older_than_the_window(store: StateStore,
                                                                    scope: str) -> None:
    await store.set(scope + "-new", "k", 1)
    old = now_ms() - store.settings.dedupe_window_ms - 1
    await store.state.conn.execute("ZADD", store.state.keys.for_scope(scope + "-old").written,
                                   old, scope + "-old")
    await expiry.forget_old_writes(store.state)  # (the store's own reaper may be first)
    assert await written_ms(store, scope + "-old") is None
    assert await written_ms(store, scope + "-new") is not None


# ---- adoption ------------------------------------------------------------------------------
async def test_an_admin_adopts_a_scope_in_use_and_it_is_logged_and_evented(
        store: StateStore, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    await store.set(scope + "-orders", "o-1", 1)
    body = {"functions_prefix": "billing", "scopes": [scope + "-orders", scope + "-new"],
            "adopt": True}
    with caplog.at_level("INFO", logger="stateworker.state.tenancy.namespaces"):
        result = await store.call("state::claim-namespace", body, caller="billing")
    assert result["claimed"] is True and result["adopted"] == [scope + "-orders"]
    assert result["scopes"] == [scope + "-new", scope + "-orders"]
    lines = [r for r in caplog.records if getattr(r, "event", "") == "claims.adopted"]
    assert len(lines) == 1
    assert lines[0].scopes == [scope + "-orders"] and lines[0].by == "billing"  # type: ignore[attr-defined]
    assert '"billing"' in lines[0].getMessage() and scope + "-orders" in lines[0].getMessage()
    (entry,) = await registry(store)
    assert msgspec.json.decode(entry["adopted"]) == [scope + "-orders"]
    assert entry["by"] == "billing" and entry["prefix"] == "billing"
    assert await refuses(store, scope + "-orders")
    assert await store.call("billing::state::get", {"scope": scope + "-orders", "key": "o-1"}) == 1
    typed = await store.claim_namespace("billing", [scope + "-orders"], adopt=True)
    assert typed.claimed is False and typed.adopted == []  # owned already: nothing adopted


async def test_a_claim_without_scopes_in_use_adopts_nothing_and_logs_nothing(
        store: StateStore, scope: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="stateworker.state.tenancy.namespaces"):
        result = await store.call("state::claim-namespace", {
            "functions_prefix": "billing", "scopes": [scope], "adopt": True}, caller="billing")
    assert "adopted" not in result
    assert not [r for r in caplog.records if getattr(r, "event", "") == "claims.adopted"]
    assert "adopted" not in (await registry(store))[0]


async def test_an_owner_claiming_its_own_busy_scope_again_is_not_in_use(
        store: StateStore, scope: str) -> None:
    await store.claim_namespace("billing", [scope])
    await store.call("billing::state::compare-and-set", {"scope": scope, "key": "k", "value": 1})
    again = await store.claim_namespace("billing", [scope])
    assert again.claimed is False and again.scopes == [scope]
    other = await claim_error(store, {"functions_prefix": "mallory", "scopes": [scope]},
                              "mallory")
    assert other.code == "SCOPE_CONFLICT"  # owned beats in use: the owner is named


# ---- acl mode: the principal ------------------------------------------------------------------
async def as_principal(store: StateStore, principal: str, body: dict[str, Any],
                       caller: str | None = None) -> Any:
    ctx = CallContext(principal=principal, caller=caller)
    raw = await functions.call_json(store.state, "state::claim-namespace",
                                    msgspec.json.encode(body), ctx, store.catalog)
    return msgspec.json.decode(raw)


async def test_in_acl_mode_the_claimant_is_the_principal_whatever_the_caller_field(
        store: StateStore, scope: str) -> None:
    for name in ("mallory", "billing"):
        await principal(store, name, allow=("claims",))
    with pytest.raises(StateError) as forbidden:
        await as_principal(store, "mallory", {"functions_prefix": "billing", "scopes": [scope]},
                           caller="billing")
    assert forbidden.value.code == "FORBIDDEN"
    assert forbidden.value.details == {"path": "$.functions_prefix", "principal": "mallory"}
    assert '"mallory"' in forbidden.value.message
    done = await as_principal(store, "billing", {"functions_prefix": "billing", "scopes": [scope]},
                              caller="someone-else")
    assert done["claimed"] is True


async def test_in_acl_mode_only_an_admin_principal_adopts(store: StateStore,
                                                          scope: str) -> None:
    await store.set(scope, "k", 1)
    await principal(store, "billing", "writer", allow=("claims",))
    await principal(store, "root", "admin")
    body = {"functions_prefix": "billing", "scopes": [scope], "adopt": True}
    with pytest.raises(StateError) as denied:  # claims, but not admin
        await as_principal(store, "billing", body)
    assert denied.value.code == "PERMISSION_DENIED"
    assert denied.value.details == {"path": "$.adopt", "principal": "billing",
                                    "fn": "state::claim-namespace", "missing": "admin"}
    await unchanged(store, scope, 1)
    root = await as_principal(store, "root", {**body, "functions_prefix": "root"})
    assert root["adopted"] == [scope]
