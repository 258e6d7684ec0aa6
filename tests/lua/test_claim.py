"""Private namespaces against real Redis: state::claim-namespace (every rule and code), the
public functions refusing claimed scopes, listings hiding them, the accessors, and claims
surviving a restart."""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.specs import NATIVE
from tests.calls import refuses
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ACCESSORS = ["get", "list", "list_keys", "compare-and-set", "list_entries"]
SEQUENCED = ACCESSORS[:4]  # run_sequence's (list_entries: tests/integration/state/test_private_listing.py)


async def claim(store: StateStore, prefix: Any, scopes: Any, caller: str | None = "same"
                ) -> Any:
    """Claim as the worker named `prefix` (`caller="same"`), another caller, or none."""
    return await store.call("state::claim-namespace",
                            {"functions_prefix": prefix, "scopes": scopes},
                            caller=prefix if caller == "same" else caller)


async def error_of(store: StateStore, fn: str, body: Any, caller: str | None = None
                   ) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body, caller=caller)
    return caught.value


async def claim_error(store: StateStore, prefix: Any, scopes: Any,
                      caller: str | None = "same") -> StateError:
    with pytest.raises(StateError) as caught:
        await claim(store, prefix, scopes, caller)
    return caught.value


async def is_public(store: StateStore, scope: str) -> bool:
    """The public functions serve `scope` (nothing claimed it)."""
    return not await refuses(store, scope)


async def registry_length(store: StateStore) -> int:
    length: int = await store.state.conn.execute("XLEN", store.state.keys.registry)
    return length


# ---- claim-namespace ------------------------------------------------------------------------
async def test_a_claim_returns_every_owned_scope_sorted_and_the_accessors(
        store: StateStore, scope: str) -> None:
    result = await claim(store, "billing", [scope + "-z", scope + "-a", scope + "-z"])
    assert result == {
        "claimed": True,
        "scopes": [scope + "-a", scope + "-z"],
        "functions": ["billing::state::get", "billing::state::list",
                      "billing::state::list_keys", "billing::state::compare-and-set",
                      "billing::state::list_entries"],
    }
    assert not await is_public(store, scope + "-a")
    assert store.state.claims.owner(scope + "-z") == "billing"
    assert store.state.claims.is_claimed(scope + "-a")
    assert not store.state.claims.is_claimed(scope)


async def test_claiming_again_claims_nothing_new_and_says_so(store: StateStore,
                                                             scope: str) -> None:
    await claim(store, "billing", [scope + "-1", scope + "-2"])
    assert await registry_length(store) == 1
    again = await claim(store, "billing", [scope + "-2", scope + "-1"])
    assert again["claimed"] is False and again["scopes"] == [scope + "-1", scope + "-2"]
    part = await claim(store, "billing", [scope + "-1"])
    assert part["claimed"] is False and part["scopes"] == [scope + "-1", scope + "-2"]
    assert await registry_length(store) == 1  # nothing new: no registry entry
    more = await claim(store, "billing", [scope + "-1", scope + "-3"])
    assert more["claimed"] is True
    assert more["scopes"] == [scope + "-1", scope + "-2", scope + "-3"]
    assert await registry_length(store) == 2


@pytest.mark.parametrize("bad", ["", "a b", "a:b", "a::state", "bill.ing", "é", "a\n",
                                 "a" * 257, 7, None, ["a"]])
async def test_a_prefix_outside_letters_digits_underscore_dash_is_invalid_prefix(
        store: StateStore, scope: str, bad: Any) -> None:
    error = await claim_error(store, bad, [scope], caller="a")
    assert error.code == "INVALID_PREFIX"
    assert error.details["path"] == "$.functions_prefix"
    assert "[A-Za-z0-9_-]+" in error.message
    assert await is_public(store, scope)


async def test_every_allowed_prefix_character_is_accepted(store: StateStore,
                                                          scope: str) -> None:
    for prefix in ("AZaz09_-", "n" * 256):
        assert (await claim(store, prefix, [scope + prefix]))["claimed"] is True


async def test_a_claim_without_a_caller_is_unknown_caller(store: StateStore,
                                                          scope: str) -> None:
    error = await claim_error(store, "billing", [scope], caller=None)
    assert error.code == "UNKNOWN_CALLER"
    assert "caller" in error.message
    assert await is_public(store, scope)


async def test_claiming_another_workers_namespace_is_forbidden(store: StateStore,
                                                               scope: str) -> None:
    error = await claim_error(store, "billing", [scope], caller="orders")
    assert error.code == "FORBIDDEN"
    assert '"billing"' in error.message and '"orders"' in error.message
    assert error.details == {"path": "$.functions_prefix", "caller": "orders"}
    assert await is_public(store, scope)
    # a body field cannot stand in for the caller
    error = await error_of(store, "state::claim-namespace", {
        "functions_prefix": "billing", "scopes": [scope], "_caller_worker_id": "billing"},
        caller="orders")
    assert error.code == "FORBIDDEN"


@pytest.mark.parametrize(("scopes", "path"), [
    ([], "$.scopes"), ([""], "$.scopes[0]"), (["ok", 1], "$.scopes[1]"),
    (["ok", None], "$.scopes[1]"), ([["x"]], "$.scopes[0]"), ([{"a": 1}], "$.scopes[0]"),
])
async def test_scopes_must_be_non_empty_text_and_nothing_is_claimed_otherwise(
        store: StateStore, scopes: list[Any], path: str) -> None:
    error = await claim_error(store, "billing", scopes)
    assert error.code == "INVALID_SCOPE"
    assert error.details["path"] == path and error.message.startswith(path)
    assert await is_public(store, "ok")
    assert await registry_length(store) == 0


async def test_a_scope_longer_than_a_name_is_key_too_long(store: StateStore) -> None:
    error = await claim_error(store, "billing", ["ok", "s" * 1025])
    assert error.code == "KEY_TOO_LONG" and error.details["path"] == "$.scopes[1]"
    assert await is_public(store, "ok")


@pytest.mark.parametrize("reserved", ["state_barrier", "state_triggers", "state_namespaces"])
async def test_a_reserved_scope_cannot_be_claimed(store: StateStore, scope: str,
                                                  reserved: str) -> None:
    error = await claim_error(store, "billing", [scope, reserved])
    assert error.code == "RESERVED_SCOPE"
    assert error.details == {"path": "$.scopes[1]", "scope": reserved}
    assert await is_public(store, scope)


async def test_a_scope_of_another_namespace_is_scope_conflict_and_nothing_is_claimed(
        store: StateStore, scope: str) -> None:
    await claim(store, "billing", [scope + "-taken"])
    error = await claim_error(store, "orders", [scope + "-free", scope + "-taken"])
    assert error.code == "SCOPE_CONFLICT"
    assert f"{scope}-taken" in error.message and '"billing"' in error.message
    assert error.details == {"path": "$.scopes", "scope": scope + "-taken", "owner": "billing"}
    await store.state.claims.reload()  # what Redis holds, as a restart would see it
    assert await is_public(store, scope + "-free")  # all or nothing
    assert store.state.claims.owner(scope + "-taken") == "billing"  # the first claimant keeps it
    unknown = await error_of(store, "orders::state::get", {"scope": scope + "-free", "key": "k"})
    assert unknown.code == "UNKNOWN_FUNCTION"  # orders owns nothing
    assert await claim(store, "orders", [scope + "-free"]) == {
        "claimed": True, "scopes": [scope + "-free"], "functions": [
            f"orders::state::{name}" for name in ACCESSORS]}


async def test_of_concurrent_claims_the_first_claimant_wins_and_the_rest_claim_nothing(
        store: StateStore, scope: str) -> None:
    outcomes: dict[str, Any] = {}

    async def one(worker: str) -> None:
        try:
            outcomes[worker] = await claim(store, worker, [scope + "-" + worker, scope])
        except StateError as exc:
            outcomes[worker] = exc

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, f"w{i}")
    winners = [w for w, result in outcomes.items() if not isinstance(result, StateError)]
    assert len(winners) == 1, outcomes
    (winner,) = winners
    for worker, result in outcomes.items():
        if worker == winner:
            assert result["claimed"] is True
            continue
        assert isinstance(result, StateError) and result.code == "SCOPE_CONFLICT"
        assert result.details["owner"] == winner
    await store.state.claims.reload()  # what Redis holds
    for worker in outcomes:
        assert await is_public(store, scope + "-" + worker) is (worker != winner)
    assert store.state.claims.owner(scope) == winner


# ---- public functions and listings ----------------------------------------------------------
def public_calls(scope: str) -> list[tuple[str, dict[str, Any]]]:
    """Every public function that takes a scope, with a valid body for it."""
    at = {"scope": scope, "key": "k"}
    return [
        ("state::get", at), ("state::set", {**at, "value": 1}), ("state::delete", at),
        ("state::list", {"scope": scope}), ("state::list_keys", {"scope": scope}),
        ("state::compare-and-set", {**at, "value": 2}), ("state::get-entry", at),
        ("state::update", {**at, "ops": [{"type": "set", "path": "a", "value": 1}]}),
        ("state::list-entries", {"scope": scope}), ("state::diff", {**at, "value": 3}),
        ("state::update-topic", {**at, "topic": "t"}),
        ("state::delete-by-topic", {"scope": scope, "topic_pattern": "*"}),
    ]


@pytest.mark.parametrize("index", range(12))
async def test_every_public_function_refuses_a_claimed_scope(store: StateStore, scope: str,
                                                             index: int) -> None:
    await claim(store, "billing", [scope])
    await store.call("billing::state::compare-and-set",
                     {"scope": scope, "key": "k", "value": {"kept": True}})
    fn, body = public_calls(scope)[index]
    error = await error_of(store, fn, body, caller="billing")  # the owner too: accessors only
    assert error.code == "RESERVED_SCOPE", fn
    assert 'claimed by namespace "billing"' in error.message
    assert error.details == {"path": "$.scope", "scope": scope, "namespace": "billing"}
    assert await store.call("billing::state::get", {"scope": scope, "key": "k"}) == {"kept": True}
    assert len(await store.events(scope)) == 1  # only the accessor's write


async def test_the_typed_methods_refuse_a_claimed_scope(store: StateStore, scope: str) -> None:
    await claim(store, "billing", [scope])
    calls = [store.get(scope, "k"), store.set(scope, "k", 1), store.delete(scope, "k"),
             store.list(scope), store.list_keys(scope), store.compare_and_set(scope, "k", 1),
             store.get_entry(scope, "k")]
    for call in calls:
        with pytest.raises(StateError) as caught:
            await call
        assert caught.value.code == "RESERVED_SCOPE"


async def test_listings_leave_claimed_scopes_out(store: StateStore, scope: str) -> None:
    await store.set(scope + "-public", "k", 1)
    await store.set(scope + "-before", "k", 1)  # holds entries before it is adopted
    await store.claim_namespace("billing", [scope + "-before", scope + "-private"], adopt=True)
    await store.call("billing::state::compare-and-set",
                     {"scope": scope + "-private", "key": "k", "value": 1})
    assert await store.list_groups() == [scope + "-public"]
    assert (await store.call("state::list_groups", {}))["groups"] == [scope + "-public"]
    listed = await store.call("state::list-namespaces", {"pattern": scope + "*"})
    assert listed == {"namespaces": [scope + "-public"]}


# ---- accessors ------------------------------------------------------------------------------
async def run_sequence(store: StateStore, get: str, list_: str, keys: str, cas: str,
                       scope: str, caller: str) -> list[Any]:
    """The same calls through the given functions; their results (or error codes)."""
    results: list[Any] = []
    steps: list[tuple[str, dict[str, Any]]] = [
        (get, {"scope": scope, "key": "k"}),
        (cas, {"scope": scope, "key": "k", "value": {"n": 1}}),
        (cas, {"scope": scope, "key": "k", "value": {"n": 2}}),
        (cas, {"scope": scope, "key": "k", "value": {"n": 2}, "expected": {"n": 1}}),
        (cas, {"scope": scope, "key": "j", "value": msgspec.Raw(b"[1.50,1e2]")}),
        (get, {"scope": scope, "key": "k"}),
        (list_, {"scope": scope}),
        (keys, {"scope": scope}),
        (cas, {"scope": scope, "key": "k", "value": 3, "expected": {"n": 9}}),
        (get, {"scope": scope, "key": "k", "extra": "ignored"}),
        (get, {"scope": scope}),
        (cas, {"scope": scope, "key": "k"}),
    ]
    for fn, body in steps:
        try:
            results.append(await store.call_json(fn, msgspec.json.encode(body), caller=caller))
        except StateError as exc:
            results.append((exc.code, exc.message, exc.details))
    return results


async def test_accessors_serve_their_own_scopes_exactly_as_the_public_functions(
        store: StateStore, scope: str) -> None:
    await claim(store, "billing", [scope + "-private"])
    private = await run_sequence(store, *[f"billing::state::{a}" for a in SEQUENCED],
                                 scope=scope + "-private", caller="anyone")
    public = await run_sequence(store, *[f"state::{a}" for a in SEQUENCED],
                                scope=scope + "-private", caller="anyone")
    # the public ones are refused; on a public scope they give what the accessors gave
    assert all(isinstance(r, tuple) and r[0] == "RESERVED_SCOPE" for r in public[:9])
    reference = await run_sequence(store, *[f"state::{a}" for a in SEQUENCED],
                                   scope=scope + "-private-ref", caller="anyone")
    assert private == reference
    assert private[5] == b'{"n":2}' and private[6] == b'[[1.50,1e2],{"n":2}]'
    assert private[8] == b'{"swapped":false,"current":{"n":2}}'
    assert [e.type for e in await store.events(scope + "-private")] == [
        "state:created", "state:updated", "state:created"]


async def test_an_accessor_refuses_a_scope_its_namespace_does_not_own(store: StateStore,
                                                                      scope: str) -> None:
    await claim(store, "billing", [scope + "-mine"])
    await claim(store, "orders", [scope + "-theirs"])
    await store.set(scope + "-public", "k", 1)
    for other in (scope + "-theirs", scope + "-public", scope + "-unused"):
        for name in ACCESSORS:
            fields = next(spec.fields for spec in NATIVE if spec.name == f"state::{name}")
            body = {k: v for k, v in {"scope": other, "key": "k", "value": 2}.items()
                    if k in fields}
            error = await error_of(store, f"billing::state::{name}", body, caller="billing")
            assert error.code == "INVALID_SCOPE", (other, name)
            assert json.dumps(other) in error.message and '"billing"' in error.message
            assert error.details == {"path": "$.scope", "scope": other, "namespace": "billing"}
    assert await store.get(scope + "-public", "k") == 1
    assert await store.call("orders::state::get", {"scope": scope + "-theirs", "key": "k"}) is None


async def test_an_accessor_of_no_namespace_is_unknown_function(store: StateStore,
                                                               scope: str) -> None:
    body = {"scope": scope, "key": "k"}
    for fn in ("billing::state::get", "billing::state::compare-and-set"):
        assert (await error_of(store, fn, body)).code == "UNKNOWN_FUNCTION"  # not claimed yet
    await claim(store, "billing", [scope])
    for fn in ("nobody::state::get", "billing::state::set", "billing::state::delete",
               "billing::state::", "billing::state::get::x", "::state::get", "billing::get",
               "billing::state::claim-namespace"):
        error = await error_of(store, fn, body)
        assert error.code == "UNKNOWN_FUNCTION", fn
        assert error.details == {"fn": fn}
    assert await store.call("billing::state::get", body) is None


# ---- restarts ------------------------------------------------------------------------------
async def test_claims_survive_a_restart(redis_server: RedisServer, prefix: str,
                                        scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as first:
        await first.claim_namespace("billing", [scope])
        await first.call("billing::state::compare-and-set",
                         {"scope": scope, "key": "k", "value": 1})
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as second:
        assert not await is_public(second, scope)
        assert await second.list_groups() == []
        assert await second.call("billing::state::get", {"scope": scope, "key": "k"}) == 1
        again = await second.claim_namespace("billing", [scope])
        assert (again.claimed, again.scopes) == (False, [scope])
        with pytest.raises(StateError) as taken:
            await second.claim_namespace("orders", [scope])
        assert taken.value.code == "SCOPE_CONFLICT"


async def test_the_typed_claim_acts_as_the_prefix_unless_told_otherwise(
        store: StateStore, scope: str) -> None:
    claimed = await store.claim_namespace("billing", [scope])
    assert claimed.claimed and claimed.scopes == [scope]
    assert claimed.functions[0] == "billing::state::get"
    with pytest.raises(StateError) as forbidden:
        await store.claim_namespace("billing", [scope], caller="orders")
    assert forbidden.value.code == "FORBIDDEN"
