"""What the tests that call state functions share: a scope's events as tuples, the
StateError a call raises, an update that increments `n`, whether a claimed scope is refused."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.state.tenancy import principals

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


# ---- every function of the catalog, in an order that works (test_service_user, http) -----
MOCO = {"user_id": "u1"}
DAGU = {"dag_name": "etl"}
Call = tuple[str, dict[str, Any], dict[str, Any] | None]


def moco_calls(value: Any) -> list[Call]:
    """Every moco function once, on namespace "n" as moco's user "u1", in an order that
    works (the set first, the delete last)."""
    return [
        ("builtin.state.set_state", {"namespace": "n", "key": "k", "value": value,
                                     "topic": "t"}, MOCO),
        ("builtin.state.get_state", {"namespace": "n", "key": "k"}, MOCO),
        ("builtin.state.get_state_with_ts", {"namespace": "n", "key": "k"}, MOCO),
        ("builtin.state.update_topic", {"namespace": "n", "key": "k", "topic": "u"}, MOCO),
        ("builtin.state.list_states", {"namespace": "n"}, MOCO),
        ("builtin.state.list_namespaces", {}, MOCO),
        ("builtin.state.delete_by_topic", {"namespace": "n", "topic_pattern": "u"}, MOCO),
        ("builtin.state.del_state", {"namespace": "n", "key": "k"}, MOCO),
    ]


def calls(prefix: str) -> list[Call]:
    """Every function of the catalog, native and the engines', once at least (the write
    paths' retries too: a diff and a Dagu get after an update compute the hash first)."""
    value = {"n": 1, "tags": ["a", "b"]}
    return [
        ("state::set", {"scope": "s", "key": "k", "value": value}, None),
        ("state::set", {"scope": "s", "key": "short", "value": 1, "ttl_ms": 1}, None),
        ("state::get", {"scope": "s", "key": "k"}, None),
        ("state::get-entry", {"scope": "s", "key": "k"}, None),
        ("state::list", {"scope": "s"}, None),
        ("state::list_keys", {"scope": "s"}, None),
        ("state::list_groups", {}, None),
        ("state::compare-and-set", {"scope": "s", "key": "c", "expected": None, "value": 1},
         None),
        ("state::update", {"scope": "s", "key": "u", "ops": [
            {"type": "increment", "path": "/n", "by": 1}]}, None),
        ("state::get-many", {"scope": "s", "keys": ["k", "u", "absent"]}, None),  # hash stored
        ("state::diff", {"scope": "s", "key": "u", "value": {"n": 7}}, None),
        ("state::list-entries", {"scope": "s"}, None),
        ("state::list_entries", {"scope": "s", "limit": 1}, None),  # a snapshot kept (pages.lua)
        ("state::on-config-change", {}, None),  # config.lua
        ("state::create-index", {"scope": "s", "pointer": "/n"}, None),  # (the writes below
        ("state::query", {"scope": "s", "where": [  # keep it: index.lua, includes/indexes.lua)
            {"pointer": "/n", "op": "eq", "value": 7}]}, None),
        ("state::query", {"scope": "s", "where": [
            {"pointer": "/n", "op": "exists", "value": True}]}, None),
        ("state::list-indexes", {"scope": "s"}, None),
        ("state::ui-content", {"path": "state/console.css"}, None),
        ("state::set", {"scope": "s", "key": "t", "value": 1, "topic": "old"}, None),
        ("state::update-topic", {"scope": "s", "key": "t", "topic": "older"}, None),
        ("state::delete-by-topic", {"scope": "s", "topic_pattern": "old*"}, None),
        ("state::delete-by-prefix", {"scope": "s", "prefix": "sh"}, None),  # "short": expired
        ("state::delete", {"scope": "s", "key": "gone"}, None),
        ("state::set-many", {"scope": "s", "entries": [{"key": "m1", "value": 1},
                                                       {"key": "m2", "value": 2}]}, None),
        ("state::delete-many", {"scope": "s", "entries": [{"key": "m1"}, {"key": "m9"}]},
         None),
        ("state::update", {"scope": "s", "key": "h", "ops": [
            {"type": "set", "path": "a", "value": 1}]}, None),  # its hash is unknown, so
        ("state::transaction", {"scope": "s", "ops": [  # the transaction stores it first
            {"op": "compare-and-set", "key": "h", "expected": {"a": 1}, "value": 2},
            {"op": "set", "key": "tx", "value": 1, "ttl_ms": 60_000},
            {"op": "delete", "key": "m2"}]}, None),
        ("state::drop-index", {"scope": "s", "pointer": "/n"}, None),
        ("state::set", {"isolation": "workflow", "key": "k", "value": 1, "max_keys": 10},
         {"org_id": "o", "workflow_id": "w", "execution_id": "e"}),
        ("state::barrier", {"event": {"key": "a"},
                            "condition_config": {"id": "named", "expect": ["a", "b"]}}, None),
        ("state::barrier", {"event": {"key": "a"},  # completed: it expires (PEXPIREAT)
                            "condition_config": {"id": "done", "expect": 1}}, None),
        ("state::delete-barrier", {"id": "named"}, None),
        ("state::claim-namespace", {"functions_prefix": "mine", "scopes": ["private"]}, None),
        ("mine::state::compare-and-set", {"scope": "private", "key": "k", "expected": None,
                                          "value": 1}, None),
        ("mine::state::get", {"scope": "private", "key": "k"}, None),
        ("mine::state::list", {"scope": "private"}, None),
        ("state::list-namespaces", {}, None),
        ("state::release-namespace", {"scopes": ["private"]}, None),
        ("state::register-trigger", {"id": "gone", "function_id": "reactor::on_change",
                                     "service": "reactor", "config": {"scope": "x"},
                                     "ttl_ms": 60_000}, None),
        ("state::keep-trigger", {"id": "gone"}, None),
        ("state::list-triggers", {}, None),
        ("state::unregister-trigger", {"id": "gone"}, None),
        *moco_calls(value),
        ("state.set", {"key": "k", "value": value}, DAGU),
        ("state.set", {"key": "k", "value": 2, "create_only": True}, DAGU),  # CONFLICT
        ("state.get", {"key": "k"}, DAGU),
        ("state::update", {"scope": "dagu/dag/etl", "key": "u", "ops": [
            {"type": "increment", "path": "/n", "by": 1}]}, None),
        ("state.get", {"key": "u"}, DAGU),
        ("state.diff", {"key": "d", "value": value}, DAGU),
        ("state.list", {}, DAGU),
        ("state.delete", {"key": "gone"}, DAGU),
    ]


EXPECTED_ERRORS = {("state.set", "CONFLICT")}  # create_only on an existing key
