"""KeeperHub's guarantees as options of the native functions: a per-scope live-key ceiling
that cannot be raced past (`max_keys`, KEY_LIMIT), conflicts naming both versions,
`updated_by` from `context.execution_id`, isolation taken from the call's context only
(`isolation: "workflow"`), and docs/keeperhub.md's example run as written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from stateworker import (
    Conflict,
    InvalidContext,
    InvalidRequest,
    KeyLimit,
    StateClient,
    StateStore,
    UnknownField,
)
from stateworker.app.service import StateService
from stateworker.clock import now_ms
from stateworker.settings import Settings
from tests.docblocks import blocks_of
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
RUN = {"org_id": "org_1", "workflow_id": "wf_7", "execution_id": "exec_42"}


async def fill(store: StateStore, scope: str, count: int) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(store.set, scope, f"k{i:03}", i)


# ---- the key ceiling -------------------------------------------------------------------------
async def test_ten_racing_writers_of_new_keys_at_99_of_100_let_exactly_one_in(
        service: StateService, redis_server: RedisServer, prefix: str, store: StateStore,
        scope: str) -> None:
    await fill(store, scope, 99)
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    outcomes: dict[int, Any] = {}

    async def writer(i: int) -> None:
        async with StateClient(settings=settings, timeout=30) as own:  # ten callers
            try:
                outcomes[i] = await own.call("state::set", {
                    "scope": scope, "key": f"new-{i}", "value": i, "max_keys": 100})
            except KeyLimit as exc:
                outcomes[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(writer, i)
    won = [i for i, outcome in outcomes.items() if isinstance(outcome, dict)]
    refused = [o for o in outcomes.values() if isinstance(o, KeyLimit)]
    assert len(won) == 1 and len(refused) == 9
    assert all(o.details["live_keys"] == 100 and o.details["limit"] == 100 for o in refused)
    keys = await store.list_keys(scope)
    assert len(keys) == 100 and f"new-{won[0]}" in keys
    assert len(await store.events(scope)) == 100  # the nine refused wrote no event


async def test_at_the_ceiling_overwrites_pass_and_new_keys_of_every_writer_are_refused(
        store: StateStore, scope: str) -> None:
    await fill(store, scope, 3)
    base = {"scope": scope, "max_keys": 3}
    assert (await store.call("state::set", {**base, "key": "k001", "value": "again"}))["version"] == 2
    new_key_writes = [
        ("state::set", {"key": "n", "value": 1}),
        ("state::update", {"key": "n", "ops": [{"type": "set", "path": "", "value": 1}]}),
        ("state::compare-and-set", {"key": "n", "value": 1}),
        ("state::diff", {"key": "n", "value": 1}),
    ]
    for fn, body in new_key_writes:
        with pytest.raises(KeyLimit) as refused:
            await store.call(fn, {**base, **body})
        assert str(refused.value) == (
            f"max_keys: scope {json.dumps(scope)} holds 3 live keys and its limit is 3; key \"n\" would be "
            "a new one, so nothing was written (overwriting a key that exists is always "
            "allowed)")
        assert refused.value.details == {"path": "$.max_keys", "scope": scope, "key": "n",
                                         "live_keys": 3, "limit": 3}
    assert await store.get(scope, "n") is None
    # an update and a diff of an existing key are overwrites
    await store.call("state::update", {**base, "key": "k002",
                                       "ops": [{"type": "increment", "path": "", "by": 1}]})
    assert (await store.call("state::diff", {**base, "key": "k000", "value": 5}))["changed"]
    assert await store.list_keys(scope) == ["k000", "k001", "k002"]
    # without max_keys the scope grows as before
    await store.set(scope, "n", 1)
    assert len(await store.list_keys(scope)) == 4


async def test_an_expired_key_frees_its_slot_before_it_is_reaped(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:  # nothing deletes the expired keys
        await store.set(scope, "a", 1)
        await store.set(scope, "short", 1, ttl_ms=1)
        part = store.state.keys.partition_of(scope)
        neighbour = next(name for name in (f"{scope}-{i}" for i in range(1000))
                         if store.state.keys.partition_of(name) == part)
        await store.set(neighbour, "x", 1, ttl_ms=1)  # same partition's ttl index: not counted
        expired_by = now_ms() + 1
        with pytest.raises(KeyLimit):
            await store.call("state::set", {"scope": scope, "key": "b", "value": 1,
                                            "max_keys": 1})
        await until(lambda: now_ms() > expired_by, 10, "the 1 ms expiry to pass")
        await store.call("state::set", {"scope": scope, "key": "b", "value": 1, "max_keys": 2})
        with pytest.raises(KeyLimit) as refused:
            await store.call("state::set", {"scope": scope, "key": "c", "value": 1,
                                            "max_keys": 2})
        assert refused.value.details["live_keys"] == 2
        assert await store.reap_expired() == 2  # both were still there, unreaped


@pytest.mark.parametrize("bad", [0, -1, 100_000_001])
async def test_max_keys_out_of_range_is_refused_before_any_write(store: StateStore, scope: str,
                                                                 bad: int) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await store.call("state::set", {"scope": scope, "key": "k", "value": 1, "max_keys": bad})
    assert refused.value.details["path"] == "$.max_keys"
    assert "between 1 and 100000000" in str(refused.value)
    assert await store.get(scope, "k") is None


# ---- conflicts and provenance ----------------------------------------------------------------
async def test_a_stale_version_names_expected_and_current(client: StateClient,
                                                          scope: str) -> None:
    for value in range(3):
        await client.call("state::set", {"scope": scope, "key": "cursor", "value": value})
    with pytest.raises(Conflict) as refused:
        await client.call("state::set", {"scope": scope, "key": "cursor", "value": 9,
                                         "expected_version": 1})
    assert str(refused.value) == (f"expected_version 1 does not match current version 3 of "
                                  f"key \"cursor\" in scope {json.dumps(scope)}")
    assert refused.value.details == {"expected_version": 1, "current_version": 3}


async def test_updated_by_is_the_calls_execution_id(client: StateClient, store: StateStore,
                                                    scope: str) -> None:
    with pytest.raises(UnknownField) as forged:  # (no body field names the writer)
        await client.call("state::set", {"scope": scope, "key": "k", "value": 1,
                                         "updated_by": "forged"}, context=RUN)
    assert forged.value.details["path"] == "$.updated_by"
    await client.call("state::set", {"scope": scope, "key": "k", "value": 1}, context=RUN)
    entry = await client.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["updated_by"] == "exec_42"
    assert [event.by for event in await store.events(scope)] == ["exec_42"]


# ---- isolation from the context --------------------------------------------------------------
async def test_isolated_calls_reach_only_their_own_workflows_scope(client: StateClient,
                                                                   store: StateStore) -> None:
    other = {**RUN, "workflow_id": "wf_8"}
    await client.call("state::set", {"isolation": "workflow", "key": "cursor", "value": 7},
                      context=RUN)
    with pytest.raises(UnknownField):  # a workflow id in the body is refused, never followed
        await client.call("state::set", {"isolation": "workflow", "key": "cursor", "value": 8,
                                         "workflow_id": "wf_7"}, context=other)
    assert await store.get("wf/org_1/wf_7", "cursor") == 7
    await client.call("state::set", {"isolation": "workflow", "key": "cursor", "value": 8},
                      context=other)
    assert await store.get("wf/org_1/wf_7", "cursor") == 7
    assert await store.get("wf/org_1/wf_8", "cursor") == 8
    read = await client.call("state::get", {"isolation": "workflow", "key": "cursor"},
                             context=other)
    assert read == 8
    listed = await client.call("state::list-entries", {"isolation": "workflow"}, context=RUN)
    assert [(e["key"], e["updated_by"]) for e in listed["entries"]] == [("cursor", "exec_42")]
    other_org = {**RUN, "org_id": "org_2"}
    assert await client.call("state::get", {"isolation": "workflow", "key": "cursor"},
                             context=other_org) is None


async def test_an_isolated_call_that_names_a_scope_is_refused(client: StateClient,
                                                              store: StateStore) -> None:
    await store.set("victim", "cursor", 1)
    with pytest.raises(InvalidRequest) as refused:
        await client.call("state::set", {"isolation": "workflow", "scope": "victim",
                                         "key": "cursor", "value": 666}, context=RUN)
    assert refused.value.details == {"path": "$.scope"}
    assert await store.get("victim", "cursor") == 1


@pytest.mark.parametrize(("context", "path"), [
    ({}, "context.org_id"),
    ({"org_id": "org_1"}, "context.workflow_id"),
    ({"org_id": "", "workflow_id": "w"}, "context.org_id"),
    ({"org_id": 7, "workflow_id": "w"}, "context.org_id"),
    ({"org_id": "a/b", "workflow_id": "w"}, "context.org_id"),  # a/b + w == a + b/w
])
async def test_an_isolated_call_needs_org_and_workflow_in_its_context(
        client: StateClient, store: StateStore, context: dict[str, Any], path: str) -> None:
    with pytest.raises(InvalidContext) as refused:
        await client.call("state::set", {"isolation": "workflow", "key": "k", "value": 1},
                          context=context)
    assert refused.value.details == {"path": path}
    assert await store.call("state::list_groups", {}) == {"groups": []}


async def test_isolation_is_refused_where_there_is_no_scope_or_no_such_mode(
        client: StateClient) -> None:
    with pytest.raises(InvalidRequest, match="state::list_groups takes no scope"):
        await client.call("state::list_groups", {"isolation": "workflow"}, context=RUN)
    with pytest.raises(InvalidRequest, match=r"\$.isolation: must be one of workflow"):
        await client.call("state::get", {"isolation": "org", "key": "k"}, context=RUN)
    # a value that merely holds the word is no isolation request
    await client.call("state::set", {"scope": "plain", "key": "k",
                                     "value": {"isolation": "workflow"}}, context=RUN)
    assert await client.call("state::get", {"scope": "plain", "key": "k"}) == {
        "isolation": "workflow"}


# ---- docs/keeperhub.md -----------------------------------------------------------------------
async def test_the_docs_example_runs_as_written(service: StateService, redis_server: RedisServer,
                                                prefix: str) -> None:
    [program] = blocks_of("docs/keeperhub.md", "python")
    [expected] = [b for b in blocks_of("docs/keeperhub.md", "") if "cursor written" in b]
    env = {"STATEWORKER_REDIS_URL": redis_server.url, "STATEWORKER_PREFIX": prefix,
           "STATEWORKER_PARTITIONS": "4", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60))
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


@pytest.mark.parametrize(("fn", "body", "expected"), [
    ("state::delete", {"key": "cursor"}, 7),
    ("state::list", {}, [7]),
    ("state::list_keys", {}, {"keys": ["cursor"]}),
    ("state::compare-and-set", {"key": "cursor", "expected": 7, "value": 8}, {"swapped": True}),
    ("state::update", {"key": "cursor", "ops": [{"type": "increment", "path": "", "by": 1}]},
     {"old_value": 7, "new_value": 8, "version": 2}),
    ("state::diff", {"key": "cursor", "value": 7, "update": False},
     {"changed": False, "found_previous": True, "previous_version": 1, "previous": 7}),
    ("state::update-topic", {"key": "cursor", "topic": "t"}, {"updated": True}),
    ("state::delete-by-topic", {"topic_pattern": "*"}, {"deleted": 0}),
])
async def test_every_scoped_function_takes_isolation(
        client: StateClient, store: StateStore, fn: str, body: dict[str, Any],
        expected: Any) -> None:
    await store.set("wf/org_1/wf_7", "cursor", 7)
    await store.set("wf/org_1/wf_8", "cursor", 70)  # another workflow's: never touched
    result = await client.call(fn, {"isolation": "workflow", **body}, context=RUN)
    assert result == expected
    assert await store.get("wf/org_1/wf_8", "cursor") == 70


async def test_an_in_process_call_is_isolated_as_a_bus_call(store: StateStore) -> None:
    await store.set("wf/org_1/wf_8", "cursor", 70)
    assert await store.call("state::set", {"isolation": "workflow", "key": "cursor",
                                           "value": 7}, context=RUN) == {
        "old_value": None, "new_value": 7, "version": 1,
        "hash": (await store.get_entry("wf/org_1/wf_7", "cursor")).hash, "created": True}
    assert await store.call("state::get", {"isolation": "workflow", "key": "cursor"},
                            context={**RUN, "workflow_id": "wf_8"}) == 70
    with pytest.raises(InvalidRequest) as refused:
        await store.call("state::set", {"isolation": "workflow", "scope": "victim",
                                        "key": "cursor", "value": 666}, context=RUN)
    assert refused.value.details == {"path": "$.scope"}
    with pytest.raises(InvalidContext):
        await store.call("state::get", {"isolation": "workflow", "key": "cursor"})


async def test_isolation_null_is_no_isolation(client: StateClient, store: StateStore) -> None:
    await client.call("state::set", {"isolation": None, "scope": "plain", "key": "k",
                                     "value": 1}, context=RUN)
    assert await store.get("plain", "k") == 1


async def test_an_engines_function_refuses_isolation_as_an_unknown_field(
        client: StateClient) -> None:
    with pytest.raises(UnknownField) as refused:
        await client.call("builtin.state.get_state", {"namespace": "n", "key": "k",
                                                      "isolation": "workflow"},
                          context={"user_id": "alice"})
    assert refused.value.details == {"path": "$.isolation", "nearest": None}
    assert 'unknown field "isolation"' in str(refused.value)


@pytest.mark.parametrize(("fn", "body"), [
    ("state::update", {"ops": [{"type": "set", "path": "", "value": 9}]}),
    ("state::diff", {"value": 9}),
    ("state::diff", {"value": 9, "update": False}),
])
async def test_every_versioned_write_names_both_versions(client: StateClient, store: StateStore,
                                                         scope: str, fn: str,
                                                         body: dict[str, Any]) -> None:
    await store.set(scope, "cursor", 1)
    await store.set(scope, "cursor", 2)
    with pytest.raises(Conflict) as refused:
        await client.call(fn, {"scope": scope, "key": "cursor", "expected_version": 1, **body})
    assert str(refused.value) == (f"expected_version 1 does not match current version 2 of "
                                  f"key \"cursor\" in scope {json.dumps(scope)}")
    assert refused.value.details == {"expected_version": 1, "current_version": 2}
    assert await store.get(scope, "cursor") == 2
