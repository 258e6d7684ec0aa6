"""iii's private-state contract (state/tests/private_state_contract.rs): a claimed scope is
RESERVED_SCOPE on every public function whatever else its body holds, and the namespace's
accessor `<prefix>::state::list_entries` pages it (only it)."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateError, StateStore

pytestmark = pytest.mark.anyio
PUBLIC = ("state::get", "state::list", "state::list_keys", "state::list_entries", "state::set",
          "state::delete", "state::update")


async def code_of(store: StateStore, fn: str, body: dict[str, Any], caller: str = "harness"
                  ) -> str:
    with pytest.raises(StateError) as refused:
        await store.call(fn, body, caller=caller)
    return refused.value.code


async def test_iiis_body_is_reserved_scope_on_every_public_function(
        store: StateStore, scope: str) -> None:
    await store.call("state::claim-namespace", {"functions_prefix": "harness",
                                                "scopes": [scope]}, caller="harness")
    for key, sid in (("legacy-key", "selected"), ("foreign-key", "other-session")):
        await store.call("harness::state::compare-and-set",
                         {"scope": scope, "key": key,
                          "value": {"session_id": sid, "function_id": "slow::work"}})
    body = {"scope": scope, "key": "legacy-key", "value": {}, "ops": []}
    for fn in PUBLIC:
        assert await code_of(store, fn, body) == "RESERVED_SCOPE", fn
    # the same body on a public scope: its own refusal, unknown fields stay refused
    public = {**body, "scope": scope + "-public"}
    assert await code_of(store, "state::get", public) == "UNKNOWN_FIELD"
    assert await code_of(store, "state::list_entries", public) == "UNKNOWN_FIELD"
    for invalid in ("public", "state_namespaces", scope + "-other"):
        assert await code_of(store, "harness::state::list_entries",
                             {"scope": invalid}) in ("INVALID_SCOPE", "RESERVED_SCOPE")
    assert await code_of(store, "harness::state::list_entries", {"scope": "public"}) == \
        "INVALID_SCOPE"
    listed = await store.call("harness::state::list_entries", {"scope": scope},
                              caller="harness")
    assert listed == {"entries": [
        ["foreign-key", {"session_id": "other-session", "function_id": "slow::work"}],
        ["legacy-key", {"session_id": "selected", "function_id": "slow::work"}]],
        "done": True, "next_cursor": None, "offset": 0, "total": 2}  # (key order)
    assert await code_of(store, "state::list_entries", {"scope": scope}) == "RESERVED_SCOPE"


async def test_the_accessor_pages_and_its_cursor_is_the_namespaces_own(
        store: StateStore, scope: str) -> None:
    await store.call("state::claim-namespace", {"functions_prefix": "harness",
                                                "scopes": [scope]}, caller="harness")
    await store.call("state::set-many", {"scope": scope + "-public", "entries": [
        {"key": f"{i:03}", "value": None} for i in range(101)]})
    accessor = "harness::state::list_entries"
    for i in range(152):
        await store.call("harness::state::compare-and-set",
                         {"scope": scope, "key": f"history-{i:03}", "value": None})
    first = await store.call(accessor, {"scope": scope}, caller="harness")
    assert len(first["entries"]) == 100 and not first["done"]
    token = first["next_cursor"]
    # the public function's cursor and the accessor's are not each other's
    public = await store.call("state::list_entries", {"scope": scope + "-public"},
                              caller="harness")
    assert await code_of(store, accessor, {"scope": scope, "cursor": public["next_cursor"]}) \
        == "INVALID_CURSOR"
    assert await code_of(store, "state::list_entries",
                         {"scope": scope, "cursor": token}) == "RESERVED_SCOPE"
    assert await code_of(store, accessor, {"scope": scope, "cursor": token},
                         caller="other") == "INVALID_CURSOR"
    last = await store.call(accessor, {"scope": scope, "cursor": token}, caller="harness")
    assert len(last["entries"]) == 52 and last["done"] and last["offset"] == 100
