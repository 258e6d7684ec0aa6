"""moco's State Store Activities (`builtin.state.*`) served by the state service, called over
the bus as a moco worker calls them: namespaces per user and shared, secret namespaces
refused, topics and their two traps, patterns, ordering, paging, typed values, and every
change made exactly as the native call makes it (the same events)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

import stateworker
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.clock import now_ms
from stateworker.engines.moco.rules import ReservedNamespace
from stateworker.errors import (
    InvalidContext,
    InvalidRequest,
    KeyTooLong,
    ReservedScope,
    StateError,
    UnknownField,
    ValueTooLarge,
)
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.docblocks import fenced_blocks, session
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ALICE = {"user_id": "alice", "execution_id": "run-a"}
BOB = {"user_id": "bob", "execution_id": "run-b"}


async def moco(client: StateClient, activity: str, body: dict[str, Any],
               context: dict[str, Any] | None = None) -> Any:
    return await client.call(f"builtin.state.{activity}", body,
                             context=ALICE if context is None else context)


async def native(client: StateClient, fn: str, body: dict[str, Any]) -> Any:
    return await client.call(f"state::{fn}", body)


async def rows(client: StateClient, **body: Any) -> list[tuple[str, str | None]]:
    """list_states of alice's `tasks` (and `body`'s other fields) as (key, topic) pairs."""
    listed = await moco(client, "list_states", {"namespace": "tasks", **body})
    return [(row["key"], row["topic"]) for row in listed]


async def set_many(client: StateClient, keys: list[str], **fields: Any) -> None:
    """Every key of alice's `tasks` set at once (concurrent calls, batched by the bus)."""
    async with anyio.create_task_group() as tg:
        for key in keys:
            tg.start_soon(moco, client, "set_state",
                          {"namespace": "tasks", "key": key, "value": key, **fields})


# ---- namespaces ---------------------------------------------------------------------------------
async def test_two_users_privately_do_not_collide_and_in_global_ns_both_see_one_value(
        client: StateClient) -> None:
    task = {"namespace": "tasks", "key": "t-1"}
    await moco(client, "set_state", {**task, "value": "alice's"}, ALICE)
    await moco(client, "set_state", {**task, "value": "bob's"}, BOB)
    assert await moco(client, "get_state", task, ALICE) == "alice's"
    assert await moco(client, "get_state", task, BOB) == "bob's"

    shared = {**task, "in_global_ns": True}
    assert await moco(client, "get_state", shared, BOB) is None
    await moco(client, "set_state", {**shared, "value": {"queued_by": "alice"}}, ALICE)
    assert await moco(client, "get_state", shared, BOB) == {"queued_by": "alice"}
    await moco(client, "del_state", shared, BOB)
    assert await moco(client, "get_state", shared, ALICE) is None
    # the private ones were never touched by the shared one
    assert await moco(client, "get_state", task, ALICE) == "alice's"
    assert await moco(client, "get_state", task, BOB) == "bob's"


async def test_the_native_scope_is_the_resolved_namespace(client: StateClient) -> None:
    await moco(client, "set_state", {"namespace": "tasks", "key": "t-1", "value": 1})
    await moco(client, "set_state", {"namespace": "tasks", "key": "t-1", "value": 2,
                                     "in_global_ns": True})
    assert await native(client, "get", {"scope": "alice:tasks", "key": "t-1"}) == 1
    assert await native(client, "get", {"scope": "tasks", "key": "t-1"}) == 2
    await native(client, "set", {"scope": "bob:tasks", "key": "t-2", "value": "native"})
    assert await moco(client, "get_state", {"namespace": "tasks", "key": "t-2"}, BOB) == "native"


async def test_a_shared_name_with_a_colon_is_that_users_private_namespace(
        client: StateClient) -> None:
    """moco's own resolution rule, kept (and documented): `in_global_ns` with `alice:tasks`
    is Alice's private `tasks`."""
    await moco(client, "set_state", {"namespace": "tasks", "key": "t", "value": "hers"})
    shared = {"namespace": "alice:tasks", "key": "t", "in_global_ns": True}
    assert await moco(client, "get_state", shared, BOB) == "hers"


async def test_a_value_over_the_limit_is_refused_naming_value(client: StateClient) -> None:
    big = "x" * (1 << 20)  # its JSON is 2 bytes more than the 1 MiB default
    with pytest.raises(ValueTooLarge) as refused:
        await moco(client, "set_state", {"namespace": "tasks", "key": "t", "value": big})
    assert refused.value.details["path"] == "$.value"
    assert refused.value.details["limit"] == 1 << 20
    assert await moco(client, "get_state", {"namespace": "tasks", "key": "t"}) is None

async def test_the_user_comes_from_the_context_only(client: StateClient) -> None:
    body = {"namespace": "tasks", "key": "t-1", "value": 1}
    for context in ({}, {"user_id": ""}, {"user_id": 7}, {"user_id": None},
                    {"execution_id": "run-a"}):
        with pytest.raises(InvalidContext) as caught:
            await moco(client, "set_state", body, context)
        assert caught.value.details["path"] == "context.user_id"
        assert "user_id" in str(caught.value)
    with pytest.raises(InvalidRequest) as refused:  # not from the body
        await moco(client, "set_state", {**body, "user_id": "alice"}, {})
    assert refused.value.details["path"] == "$.user_id"
    with pytest.raises(InvalidContext):
        await moco(client, "list_namespaces", {}, {})
    # the shared namespace needs no user
    await moco(client, "set_state", {**body, "in_global_ns": True}, {})
    assert await moco(client, "get_state", {"namespace": "tasks", "key": "t-1",
                                            "in_global_ns": True}, {}) == 1
    assert await native(client, "list_groups", {}) == {"groups": ["tasks"]}


async def test_a_user_id_with_a_colon_is_refused(client: StateClient) -> None:
    # else user "a:b" with namespace "c" and user "a" with namespace "b:c" would share a:b:c
    await moco(client, "set_state", {"namespace": "b:c", "key": "k", "value": "a's"},
               {"user_id": "a"})
    with pytest.raises(InvalidContext) as caught:
        await moco(client, "get_state", {"namespace": "c", "key": "k"}, {"user_id": "a:b"})
    assert caught.value.details["path"] == "context.user_id"
    assert "':'" in str(caught.value)


async def test_a_too_long_resolved_namespace_names_the_namespace(client: StateClient) -> None:
    name = "n" * 1020  # fits the 1024 bytes alone, not with "alice:"
    body = {"namespace": name, "key": "k", "value": 1}
    with pytest.raises(KeyTooLong) as caught:
        await moco(client, "set_state", body)
    assert caught.value.details == {"path": "$.namespace", "size": 1026, "limit": 1024}
    assert "alice:" in str(caught.value) and "1024" in str(caught.value)
    await moco(client, "set_state", {**body, "in_global_ns": True})


async def test_the_service_s_own_scopes_are_refused_naming_the_namespace(
        client: StateClient) -> None:
    with pytest.raises(ReservedScope) as caught:
        await moco(client, "set_state", {"namespace": "state_barrier", "key": "k", "value": 1,
                                         "in_global_ns": True})
    assert caught.value.details == {"path": "$.namespace", "scope": "state_barrier"}
    assert str(caught.value).startswith('namespace "state_barrier" is reserved')


async def test_a_claimed_namespace_is_refused_naming_who_claimed_it(
        client: StateClient) -> None:
    async with StateClient(settings=client.settings, caller="vault") as vault:
        await vault.claim_namespace("vault", ["alice:locked"])
    for activity, body in (("set_state", {"namespace": "locked", "key": "k", "value": 1}),
                           ("get_state", {"namespace": "locked", "key": "k"})):
        with pytest.raises(ReservedScope) as caught:
            await moco(client, activity, body)
        assert caught.value.details == {"path": "$.namespace", "scope": "alice:locked",
                                        "claimed_by": "vault"}, activity


# ---- secret namespaces --------------------------------------------------------------------------
REFUSING = {
    "set_state": {"key": "k", "value": "leak", "topic": "t"},
    "get_state": {"key": "k"},
    "get_state_with_ts": {"key": "k"},
    "del_state": {"key": "k"},
    "list_states": {},
    "update_topic": {"key": "k", "topic": "t"},
    "delete_by_topic": {"topic_pattern": "*"},
}
SECRETS = [("secret", True), ("secret", False), ("alice:secret", True), ("bob:secret", True),
           ("bob:secret", False), ("x:y:secret", False)]


@pytest.fixture
async def secrets(client: StateClient) -> list[str]:
    """Secrets as moco keeps them, in the same store: `secret` and `<user_id>:secret`."""
    scopes = ["secret", "alice:secret", "bob:secret", "alice:bob:secret", "alice:x:y:secret"]
    for scope in scopes:
        await native(client, "set", {"scope": scope, "key": "k", "value": "s3cr3t",
                                     "topic": "t"})
    return scopes


@pytest.mark.parametrize("activity", sorted(REFUSING))
@pytest.mark.parametrize(("namespace", "in_global_ns"), SECRETS)
async def test_every_activity_refuses_secret_namespaces(
        client: StateClient, secrets: list[str], activity: str, namespace: str,
        in_global_ns: bool) -> None:
    body = {"namespace": namespace, "in_global_ns": in_global_ns, **REFUSING[activity]}
    with pytest.raises(ReservedNamespace) as caught:
        await moco(client, activity, body)
    assert caught.value.code == "ReservedNamespaceError"
    assert caught.value.details["path"] == "$.namespace"
    assert f"namespace {json.dumps(namespace)} is reserved" in str(caught.value)
    for scope in secrets:  # nothing read or changed
        entry = await native(client, "get-entry", {"scope": scope, "key": "k"})
        assert (entry["value"], entry["version"], entry["topic"]) == ("s3cr3t", 1, "t")


async def test_a_secret_namespace_is_refused_before_the_user_is_looked_at(
        client: StateClient) -> None:
    with pytest.raises(ReservedNamespace):
        await moco(client, "get_state", {"namespace": "secret", "key": "k"}, {})


async def test_a_client_raises_stateworkers_reserved_namespace_error(
        client: StateClient) -> None:
    try:
        await moco(client, "get_state", {"namespace": "secret", "key": "k"})
    except StateError as refused:  # (what a caller catching every state error catches)
        assert type(refused) is stateworker.ReservedNamespaceError
        assert refused.to_dict() == {
            "code": "ReservedNamespaceError", "details": {"path": "$.namespace",
                                                          "namespace": "secret"},
            "message": 'namespace "secret" is reserved: `secret` and `<user_id>:secret` hold '
                       "secrets, which the state activities never read or write (use the "
                       "Secret Activities)"}
    else:
        raise AssertionError("not refused")


def test_every_process_maps_the_code_to_its_class() -> None:
    """A process that imports only the error table (as a client's reply does) maps moco's
    code to its class: importing any stateworker module imports the package first, which
    registers it (engines/moco/rules.py)."""
    program = ("from stateworker.errors import error_from\n"
               "cls = type(error_from('ReservedNamespaceError', 'm'))\n"
               "print(cls.__module__, cls.__name__)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["stateworker.engines.moco.rules", "ReservedNamespace"]


async def test_list_namespaces_never_lists_secret_namespaces(
        client: StateClient, secrets: list[str]) -> None:
    await moco(client, "set_state", {"namespace": "tasks", "key": "k", "value": 1})
    await moco(client, "set_state", {"namespace": "secrets", "key": "k", "value": 1,
                                     "in_global_ns": True})
    for name_pattern in (None, "*", "*secret*"):
        body = {"name_pattern": name_pattern}
        own = await moco(client, "list_namespaces", body)
        shared = await moco(client, "list_namespaces", {**body, "in_global_ns": True})
        assert own == (["tasks"] if name_pattern != "*secret*" else [])
        assert shared == ["secrets"]  # (a namespace merely named so is listed)
    assert await moco(client, "list_namespaces", {}, BOB) == []


# ---- list_namespaces ----------------------------------------------------------------------------
async def test_list_namespaces_lists_the_caller_s_own_or_the_shared_ones(
        client: StateClient) -> None:
    for namespace, context, shared in [("tasks", ALICE, False), ("cache", ALICE, False),
                                       ("a:b", ALICE, False), ("tasks", BOB, False),
                                       ("tasks", ALICE, True), ("task-archive", BOB, True),
                                       ("fx-rates", BOB, True)]:
        await moco(client, "set_state", {"namespace": namespace, "key": "k", "value": namespace,
                                         "in_global_ns": shared}, context)
    await native(client, "set", {"scope": "orders", "key": "k", "value": 1})  # a native scope

    own = await moco(client, "list_namespaces", {})
    assert own == ["a:b", "cache", "tasks"]  # without "alice:", byte order
    assert await moco(client, "list_namespaces", {}, BOB) == ["tasks"]
    for name in own:  # a listed name, fed back, reads alice's entry
        assert await moco(client, "get_state", {"namespace": name, "key": "k"}) == name
    shared = await moco(client, "list_namespaces", {"in_global_ns": True}, BOB)
    assert shared == ["fx-rates", "orders", "task-archive", "tasks"]

    assert await moco(client, "list_namespaces", {"in_global_ns": True,
                                                  "name_pattern": "task*"}) == [
        "task-archive", "tasks"]
    assert await moco(client, "list_namespaces", {"name_pattern": "*s"}) == ["tasks"]
    assert await moco(client, "list_namespaces", {"name_pattern": "a:*"}) == ["a:b"]
    assert await moco(client, "list_namespaces", {"in_global_ns": True, "limit": 2}) == [
        "fx-rates", "orders"]
    assert await moco(client, "list_namespaces", {"name_pattern": "*a*", "limit": 1}) == ["a:b"]
    assert await moco(client, "list_namespaces", {"limit": 0}) == []
    with pytest.raises(InvalidRequest) as caught:
        await moco(client, "list_namespaces", {"limit": -1})
    assert caught.value.details["path"] == "$.limit" and "0 or more" in str(caught.value)


# ---- topics -------------------------------------------------------------------------------------
async def test_set_state_without_topic_clears_an_earlier_topic(client: StateClient) -> None:
    task = {"namespace": "tasks", "key": "t-1"}
    await moco(client, "set_state", {**task, "value": 1, "topic": "pending"})
    assert await rows(client) == [("t-1", "pending")]
    await moco(client, "set_state", {**task, "value": 2})  # trap 1: the tag goes
    assert await rows(client) == [("t-1", None)]
    assert await rows(client, topic_pattern="pending") == []

    await moco(client, "set_state", {**task, "value": 3, "topic": "pending"})
    await moco(client, "update_topic", {**task, "topic": "dispatched"})  # retag, keep value
    assert await rows(client) == [("t-1", "dispatched")]
    assert await moco(client, "get_state", task) == 3
    await moco(client, "update_topic", task)  # topic omitted: cleared, as null
    assert await rows(client) == [("t-1", None)]


async def test_untagged_rows_never_match_a_topic_pattern(client: StateClient) -> None:
    await moco(client, "set_state", {"namespace": "tasks", "key": "tagged", "value": 1,
                                     "topic": "pending"})
    await moco(client, "set_state", {"namespace": "tasks", "key": "empty-tag", "value": 1,
                                     "topic": ""})
    await moco(client, "set_state", {"namespace": "tasks", "key": "untagged", "value": 1})
    assert await rows(client, topic_pattern="*") == [("empty-tag", ""), ("tagged", "pending")]
    assert await rows(client, topic_pattern="") == [("empty-tag", "")]
    # trap 2: delete_by_topic "*" cannot empty the namespace
    assert await moco(client, "delete_by_topic", {"namespace": "tasks",
                                                  "topic_pattern": "*"}) == 2
    assert await rows(client) == [("untagged", None)]


async def test_update_topic_keeps_value_version_and_update_time(client: StateClient) -> None:
    task = {"namespace": "tasks", "key": "t-1"}
    await moco(client, "set_state", {**task, "value": {"n": 1}, "topic": "pending"})
    await moco(client, "set_state", {**task, "value": {"n": 2}, "topic": "pending"})
    before = await native(client, "get-entry", {"scope": "alice:tasks", "key": "t-1"})
    written = await moco(client, "get_state_with_ts", task)
    wait_for_next_ms(now_ms())
    assert await moco(client, "update_topic", {**task, "topic": "done"}) is None
    after = await native(client, "get-entry", {"scope": "alice:tasks", "key": "t-1"})
    assert (after["value"], after["version"], after["updated_at"], after["topic"]) == (
        {"n": 2}, 2, before["updated_at"], "done")
    assert await moco(client, "get_state_with_ts", task) == written


async def test_update_topic_on_a_missing_key_is_a_silent_no_op(
        client: StateClient, store: StateStore) -> None:
    missing = {"namespace": "tasks", "key": "nobody"}
    assert await moco(client, "update_topic", {**missing, "topic": "dispatched"}) is None
    assert await moco(client, "get_state", missing) is None
    assert await rows(client) == []
    assert await store.events("alice:tasks") == []


async def test_delete_by_topic_returns_the_count(client: StateClient) -> None:
    for key, topic in [("t-1", "completed-ok"), ("t-2", "completed-failed"), ("t-3", "pending"),
                       ("t-4", "completed"), ("t-5", None)]:
        await moco(client, "set_state", {"namespace": "tasks", "key": key, "value": 1,
                                         "topic": topic})
    purge = {"namespace": "tasks", "topic_pattern": "completed-*"}
    assert await moco(client, "delete_by_topic", purge) == 2
    assert await moco(client, "delete_by_topic", purge) == 0
    assert await rows(client) == [("t-3", "pending"), ("t-4", "completed"), ("t-5", None)]
    assert await moco(client, "delete_by_topic", {"namespace": "tasks",
                                                  "topic_pattern": "completed"}) == 1
    # another user's rows of the same name are not touched
    assert await moco(client, "delete_by_topic", {"namespace": "tasks",
                                                  "topic_pattern": "*"}, BOB) == 0
    assert await rows(client) == [("t-3", "pending"), ("t-5", None)]
    with pytest.raises(InvalidRequest) as caught:
        await moco(client, "delete_by_topic", {"namespace": "tasks"})
    assert caught.value.details["path"] == "$.topic_pattern"
    assert "required" in str(caught.value)
    with pytest.raises(InvalidRequest) as nul:
        await moco(client, "delete_by_topic", {"namespace": "tasks", "topic_pattern": "a\0"})
    assert nul.value.details["path"] == "$.topic_pattern"
    assert str(nul.value).startswith("$.topic_pattern: must not contain the NUL")


# ---- patterns, ordering, paging -----------------------------------------------------------------
async def test_star_is_the_only_wildcard(client: StateClient) -> None:
    keys = ["a%b", "a_b", "a?b", "axb", "a.b", "task-1", "task-10", "other", "a*b"]
    for key in keys:
        await moco(client, "set_state", {"namespace": "tasks", "key": key, "value": 1,
                                         "topic": "t" + key})

    async def matching(**body: Any) -> list[str]:
        return [key for key, _topic in await rows(client, **body)]

    for literal in ["a%b", "a_b", "a?b", "a.b"]:
        assert await matching(key_pattern=literal) == [literal]
        assert await matching(topic_pattern="t" + literal) == [literal]
    assert await matching(key_pattern="task-*") == ["task-1", "task-10"]
    assert await matching(key_pattern="task-*", order_direction="desc") == ["task-10", "task-1"]
    assert await matching(key_pattern="*b") == ["a%b", "a*b", "a.b", "a?b", "a_b", "axb"]
    assert await matching(key_pattern="a*b", order_by="topic") == [
        "a%b", "a*b", "a.b", "a?b", "a_b", "axb"]
    assert await matching(key_pattern="*-1*") == ["task-1", "task-10"]
    assert await matching(key_pattern="**") == sorted(keys)
    assert await matching(topic_pattern="ttask*", key_pattern="*0") == ["task-10"]
    assert await matching(key_pattern="task") == []


def wait_for_next_ms(last: int) -> None:
    """Until the clock has passed `last` (at most a millisecond): the next write's update time
    is then later than the last one's."""
    while now_ms() <= last:
        pass


async def test_each_order_by_in_both_directions(client: StateClient) -> None:
    # written c, a, b (update times in that order); topics w, x and none
    for key, topic in [("c", "w"), ("a", "x"), ("b", None)]:
        await moco(client, "set_state", {"namespace": "tasks", "key": key, "value": key,
                                         "topic": topic})
        wait_for_next_ms(now_ms())
    # a retag changes no update time
    await moco(client, "update_topic", {"namespace": "tasks", "key": "c", "topic": "w"})
    expected = {("key", "asc"): "abc", ("key", "desc"): "cba",
                ("last_update_time", "asc"): "cab", ("last_update_time", "desc"): "bac",
                # untagged rows last going up, first going down (as PostgreSQL's NULLs)
                ("topic", "asc"): "cab", ("topic", "desc"): "bac"}
    for (order_by, direction), keys in expected.items():
        listed = await rows(client, order_by=order_by, order_direction=direction)
        assert "".join(key for key, _ in listed) == keys, (order_by, direction)
    assert "".join(k for k, _ in await rows(client)) == "abc"  # default: key, asc
    with pytest.raises(InvalidRequest) as caught:
        await rows(client, order_by="updated_at")
    assert caught.value.details["path"] == "$.order_by"
    with pytest.raises(InvalidRequest) as direction_caught:
        await rows(client, order_direction="down")
    assert direction_caught.value.details["path"] == "$.order_direction"


async def test_limit_and_offset_page_through_rows(client: StateClient) -> None:
    keys = [f"k{i:02d}" for i in range(10)]
    await set_many(client, keys)

    async def listed(**body: Any) -> list[str]:
        return [key for key, _ in await rows(client, **body)]

    assert await listed(limit=3) == keys[:3]
    assert await listed(limit=3, offset=3) == keys[3:6]
    assert await listed(limit=3, offset=9) == keys[9:]
    assert await listed(limit=3, offset=10) == []
    assert await listed(offset=4) == keys[4:]
    assert await listed(limit=None, offset=None) == keys
    assert await listed(limit=0) == []
    assert await listed(limit=2, offset=1, order_direction="desc") == ["k08", "k07"]
    for field, value, bound in [("limit", -1, "0 or more"), ("offset", -1, "0 or more"),
                                ("offset", 10**9 + 1, "1000000000")]:
        with pytest.raises(InvalidRequest) as caught:
            await listed(**{field: value})
        assert caught.value.details["path"] == f"$.{field}"
        assert bound in str(caught.value), str(caught.value)
    with pytest.raises(InvalidRequest) as not_int:
        await listed(limit="10")
    assert not_int.value.details["path"] == "$.limit"


async def test_limit_null_returns_every_row_past_the_native_page(client: StateClient) -> None:
    keys = [f"k{i:04d}" for i in range(2500)]  # past 1000 a page and 2000 examined a call
    await set_many(client, keys)
    assert [key for key, _ in await rows(client)] == keys
    assert [key for key, _ in await rows(client, order_direction="desc", offset=100)] == \
        keys[::-1][100:]
    assert [key for key, _ in await rows(client, limit=1500, offset=700)] == keys[700:2200]
    assert len(await rows(client, order_by="last_update_time")) == 2500
    # a filter that keeps a few rows far apart: short pages, walked on by their cursor
    for key in ("k0003", "k1999", "k2498"):
        await moco(client, "update_topic", {"namespace": "tasks", "key": key, "topic": "rare"})
    assert await rows(client, topic_pattern="rare") == [
        ("k0003", "rare"), ("k1999", "rare"), ("k2498", "rare")]
    assert await rows(client, topic_pattern="rare", limit=2, offset=1) == [
        ("k1999", "rare"), ("k2498", "rare")]
    assert await rows(client, topic_pattern="rare", order_by="topic",
                      order_direction="desc") == [
        ("k2498", "rare"), ("k1999", "rare"), ("k0003", "rare")]


async def test_a_pattern_is_at_most_1024_bytes_in_every_activity_that_takes_one(
        client: StateClient) -> None:
    fits, over = "é" * 511 + "**", "é" * 511 + "***"  # 1024 and 1025 bytes of UTF-8
    await moco(client, "set_state", {"namespace": "p", "key": "k", "value": 1, "topic": "t"})
    calls = [("list_states", {"namespace": "p"}, "key_pattern"),
             ("list_states", {"namespace": "p"}, "topic_pattern"),
             ("list_namespaces", {}, "name_pattern"),
             ("delete_by_topic", {"namespace": "p"}, "topic_pattern")]
    for activity, body, field in calls:
        assert await moco(client, activity, {**body, field: fits}) in ([], 0), (activity, field)
        with pytest.raises(InvalidRequest) as caught:
            await moco(client, activity, {**body, field: over})
        assert caught.value.details == {"path": f"$.{field}", "size": 1025, "limit": 1024}
        assert str(caught.value) == f"{field} is 1025 bytes, more than the limit of 1024 bytes"
    assert await moco(client, "get_state", {"namespace": "p", "key": "k"}) == 1


# ---- reads --------------------------------------------------------------------------------------
async def test_get_state_with_ts_gives_an_aware_time_fromisoformat_reads(
        client: StateClient) -> None:
    task = {"namespace": "fx-rates", "key": "EURUSD"}
    assert await moco(client, "get_state_with_ts", task) == {"value": None,
                                                             "last_update_time": None}
    before = dt.datetime.now(dt.UTC)
    await moco(client, "set_state", {**task, "value": {"rate": 1.0842}})
    cached = await moco(client, "get_state_with_ts", task)
    assert cached["value"] == {"rate": 1.0842}
    text = cached["last_update_time"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", text), text
    written = dt.datetime.fromisoformat(text)
    assert written.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(milliseconds=1) <= written <= dt.datetime.now(dt.UTC)
    # moco's own freshness test, as its documentation writes it
    age = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(text)).total_seconds()
    assert 0 <= age < 60
    entry = await native(client, "get-entry", {"scope": "alice:fx-rates", "key": "EURUSD"})
    assert entry["updated_at"].replace("Z", "+00:00") == text


async def test_missing_keys_read_as_null_and_delete_without_error(client: StateClient) -> None:
    task = {"namespace": "tasks", "key": "t-1"}
    assert await moco(client, "get_state", task) is None
    assert await moco(client, "del_state", task) is None
    assert await moco(client, "set_state", {**task, "value": None}) is None
    assert await rows(client) == [("t-1", None)]  # a stored null is a row
    assert await moco(client, "del_state", task) is None
    assert await rows(client) == []


async def test_typed_values_round_trip(client: StateClient) -> None:
    value = {
        "aware": dt.datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=dt.timezone(
            dt.timedelta(hours=5, minutes=30))),
        "naive": dt.datetime(2026, 3, 1, 12, 30, 5),
        "day": dt.date(2026, 3, 1),
        "at": dt.time(23, 59, 58, 999000),
        "amount": decimal.Decimal("1234.5000"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "blob": b"\x00\xffbytes",
        "list": [decimal.Decimal("0.10"), dt.date(1999, 12, 31)],
    }
    await moco(client, "set_state", {"namespace": "typed", "key": "k", "value": value})
    read = await moco(client, "get_state", {"namespace": "typed", "key": "k"})
    assert read == value
    assert {name: type(v) for name, v in read.items()} == {
        name: type(v) for name, v in value.items()}
    assert read["aware"].utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert read["naive"].tzinfo is None
    assert str(read["amount"]) == "1234.5000" and str(read["list"][0]) == "0.10"
    with_ts = await moco(client, "get_state_with_ts", {"namespace": "typed", "key": "k"})
    assert with_ts["value"] == value


# ---- requests -----------------------------------------------------------------------------------
ACTIVITIES = {**REFUSING, "list_namespaces": {}}


@pytest.mark.parametrize("activity", sorted(ACTIVITIES))
@pytest.mark.parametrize("field", ["in_globl_ns", "scope", "ttl_ms"])
async def test_unknown_fields_are_refused(client: StateClient, activity: str,
                                          field: str) -> None:
    body = {"namespace": "tasks", **ACTIVITIES[activity], field: True}
    if activity == "list_namespaces":
        body.pop("namespace")
    with pytest.raises(UnknownField) as caught:
        await moco(client, activity, body)
    assert caught.value.details["path"] == f"$.{field}"
    near = ' (did you mean "in_global_ns"?)' if field == "in_globl_ns" else ""
    assert str(caught.value).startswith(f'$.{field}: unknown field "{field}"{near}; '
                                        f"builtin.state.{activity} takes only ")
    assert await native(client, "list_groups", {}) == {"groups": []}  # nothing written


async def test_required_fields_and_types_are_named(client: StateClient) -> None:
    for activity, body, path in [
            ("set_state", {"namespace": "tasks", "key": "k"}, "$.value"),
            ("set_state", {"key": "k", "value": 1}, "$.namespace"),
            ("get_state", {"namespace": "tasks"}, "$.key"),
            ("get_state", {"namespace": "tasks", "key": 5}, "$.key"),
            ("del_state", {"namespace": "tasks", "key": "k", "in_global_ns": None},
             "$.in_global_ns"),
            ("update_topic", {"namespace": "tasks", "key": "k", "topic": 1}, "$.topic")]:
        with pytest.raises(InvalidRequest) as caught:
            await moco(client, activity, body)
        assert caught.value.details["path"] == path, (activity, body)
        assert path in str(caught.value)
    with pytest.raises(InvalidRequest) as caught:  # a missing field: the activity needs it
        await moco(client, "get_state", {"namespace": "tasks"})
    assert str(caught.value) == "$.key: the field `key` is required by builtin.state.get_state"


# ---- the same change as the native call ---------------------------------------------------------
async def test_every_change_is_the_native_call_s_with_the_same_events(
        client: StateClient, store: StateStore) -> None:
    """The same steps through moco's activities (alice's `tasks`) and the native functions
    (scope `native`): the same event types, versions, values and writer."""
    moco_steps = [
        ("set_state", {"key": "k", "value": {"n": 1}, "topic": "pending"}),
        ("set_state", {"key": "k", "value": {"n": 2}, "topic": "pending"}),
        ("update_topic", {"key": "k", "topic": "done"}),
        ("update_topic", {"key": "k", "topic": "done"}),  # unchanged: no event
        ("update_topic", {"key": "missing", "topic": "done"}),  # missing: no event
        ("set_state", {"key": "j", "value": [1]}),
        ("del_state", {"key": "k"}),
        ("del_state", {"key": "k"}),  # already gone: no event
        ("set_state", {"key": "k", "value": 3, "topic": "done"}),
        ("delete_by_topic", {"topic_pattern": "d*"}),
    ]
    native_steps = [
        ("set", {"key": "k", "value": {"n": 1}, "topic": "pending"}),
        ("set", {"key": "k", "value": {"n": 2}, "topic": "pending"}),
        ("update-topic", {"key": "k", "topic": "done"}),
        ("update-topic", {"key": "k", "topic": "done"}),
        ("update-topic", {"key": "missing", "topic": "done"}),
        ("set", {"key": "j", "value": [1]}),
        ("delete", {"key": "k"}),
        ("delete", {"key": "k"}),
        ("set", {"key": "k", "value": 3, "topic": "done"}),
        ("delete-by-topic", {"topic_pattern": "d*"}),
    ]
    for activity, body in moco_steps:
        await moco(client, activity, {"namespace": "tasks", **body})
    for fn, body in native_steps:
        await client.call(f"state::{fn}", {"scope": "native", **body},
                          context={"execution_id": "run-a"})

    def shape(events: list[Any]) -> list[tuple[Any, ...]]:
        return [(e.type, e.key, bytes(e.old_value), bytes(e.new_value), e.version, e.by)
                for e in events]

    via_moco = shape(await store.events("alice:tasks"))
    assert via_moco == shape(await store.events("native"))
    assert [event[0] for event in via_moco] == [
        "state:created", "state:updated", "state:updated", "state:created", "state:deleted",
        "state:created", "state:deleted"]
    assert {event[5] for event in via_moco} == {"run-a"}  # updated_by: the execution
    entry = await native(client, "get-entry", {"scope": "alice:tasks", "key": "j"})
    assert entry["updated_by"] == "run-a"


async def test_a_write_fires_the_triggers_of_its_resolved_namespace(
        client: StateClient, redis_server: RedisServer, prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    worker = Worker("reactor", settings=settings, options=BusOptions(block_ms=50))
    calls: list[dict[str, Any]] = []

    @worker.function("reactor::on_change")
    async def on_change(body: dict[str, Any], call: Call) -> None:
        calls.append(body)

    await client.call("state::register-trigger", {
        "id": "alice-tasks", "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": "alice:tasks"}})
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await moco(client, "set_state", {"namespace": "tasks", "key": "t-1", "value": 1}, BOB)
        await moco(client, "set_state", {"namespace": "tasks", "key": "t-1", "value": 2})
        await until(lambda: len(calls) >= 1, 10, "the handler call")
        worker.stop()
    assert [(c["scope"], c["key"], c["new_value"], c["by"]) for c in calls] == [
        ("alice:tasks", "t-1", 2, "run-a")]


async def test_a_retried_call_is_applied_once(client: StateClient) -> None:
    """moco retries an activity; the same call id changes state once."""
    body = {"namespace": "tasks", "key": "t-1", "value": 1, "topic": "done"}
    for _ in range(2):
        assert await moco(client, "set_state", body) is None
        await client.call("builtin.state.set_state", body, context=ALICE, call_id="save-1")
    entry = await native(client, "get-entry", {"scope": "alice:tasks", "key": "t-1"})
    assert entry["version"] == 3  # two calls without an id, one with an id sent twice
    purge = {"namespace": "tasks", "topic_pattern": "done"}
    assert await client.call("builtin.state.delete_by_topic", purge, context=ALICE,
                             call_id="purge-1") == 1
    await client.call("builtin.state.set_state", {**body, "key": "t-2"}, context=ALICE)
    # The retry gets the first run's reply and deletes nothing written since.
    assert await client.call("builtin.state.delete_by_topic", purge, context=ALICE,
                             call_id="purge-1") == 1
    assert (await native(client, "get-entry", {"scope": "alice:tasks", "key": "t-2"}))["found"]


# ---- docs/moco.md -------------------------------------------------------------------------------
async def test_the_docs_examples_run_as_written(service: StateService, redis_server: RedisServer,
                                                 prefix: str, tmp_path: Path) -> None:
    """Every block of docs/moco.md (not copied here), in order, against the service: a
    `python` block is a program that must print what its `# prints` comments say, a `console`
    block's `$ ` lines are commands that must print the lines after them."""
    blocks = fenced_blocks("docs/moco.md")
    env = {**os.environ, "STATEWORKER_REDIS_URL": redis_server.url,
           "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = []
    for n, (kind, text) in enumerate(blocks):
        if kind == "python":
            program = tmp_path / f"moco_example_{n}.py"
            program.write_text(text)
            steps = [([sys.executable, str(program)],
                      [w.strip() for w in re.findall(r"# prints (.*)$", text, re.MULTILINE)])]
        elif kind == "console":
            steps = [(["bash", "-c", command], expected) for command, expected in session(text)]
        else:
            continue
        for command, expected in steps:
            done = await anyio.run_process(command, env=env, check=False)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            assert expected, f"{command} says what it prints"
            assert done.stdout.decode().splitlines() == expected, command
        ran.append(kind)
    assert ran == ["python", "console"]

