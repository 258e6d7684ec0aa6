"""Dagu's state actions over the bus (`state.get|set|delete|list|diff`): Dagu's scopes,
namespaces, rules, texts and outputs, served by the state service on top of the native
functions (docs/dagu.md)."""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.engines.dagu import rules
from stateworker.engines.dagu.rules import go_time
from stateworker.errors import (
    Conflict,
    InvalidContext,
    InvalidRequest,
    KeyTooLong,
    NotFound,
    ReservedScope,
    ValueTooLarge,
)
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ETL = {"dag_name": "etl"}
LAST_ID_HASH = "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
AB_HASH = "43258cff783fe7036d8a43033f830adfc60ec037382473548ac742b888292777"  # {"a":1,"b":2}
GO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,2}[1-9])?Z")


async def dagu(client: StateClient, action: str, body: dict[str, Any],
               context: dict[str, Any] | None = ETL) -> Any:
    return await client.call(f"state.{action}", body, context=context)


async def dagu_json(client: StateClient, action: str, body: dict[str, Any],
                    context: dict[str, Any] | None = ETL) -> bytes:
    """The exact output, as the step prints it."""
    return await client.call_json(f"state.{action}", msgspec.json.encode(body), context=context)


async def refused(client: StateClient, action: str, body: dict[str, Any],
                  context: dict[str, Any] | None = ETL) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        await dagu(client, action, body, context)
    return info.value


# ---- outputs and values ------------------------------------------------------------------------
async def test_set_and_get_print_daguss_outputs_field_for_field(client: StateClient) -> None:
    body = {"key": "cursor", "value": {"last_id": 123}}
    assert await dagu_json(client, "set", body) == (
        b'{"operation":"set","scope":"dag","namespace":"etl","key":"cursor","version":1,'
        b'"hash":"' + LAST_ID_HASH.encode() + b'","created":true}')
    assert await dagu_json(client, "get", {"key": "cursor"}) == (
        b'{"operation":"get","scope":"dag","namespace":"etl","key":"cursor","found":true,'
        b'"version":1,"hash":"' + LAST_ID_HASH.encode() + b'","value":{"last_id":123}}')
    again = await dagu(client, "set", {**body, "value": {"last_id": 124}})
    assert (again["version"], again["created"]) == (2, False)


async def test_values_are_stored_normalized_so_the_stored_text_hashes_to_the_hash(
        client: StateClient) -> None:
    written = await dagu(client, "set", {"key": "k", "value": {"b": 2, "a": 1}})
    assert written["hash"] == AB_HASH == hashlib.sha256(b'{"a":1,"b":2}').hexdigest()
    text = await dagu_json(client, "get", {"key": "k"})
    assert text.endswith(b'"value":{"a":1,"b":2}}')
    native = await client.call_json("state::get-entry", b'{"scope":"dagu/dag/etl","key":"k"}')
    stored = msgspec.json.decode(native, type=dict[str, msgspec.Raw])["value"]
    assert hashlib.sha256(bytes(stored)).hexdigest() == AB_HASH
    nested = await client.call_json("state.set", b'{"key":"n","value":{"z":[{"y":1,"x":1.50}]}}',
                                    context=ETL)  # (numbers as written: 1.50 stays 1.50)
    assert msgspec.json.decode(nested)["hash"] == \
        hashlib.sha256(b'{"z":[{"x":1.50,"y":1}]}').hexdigest()
    escaped = await dagu(client, "set", {"key": "e", "value": {"b": "<&>\u2028", "a": "é"}})
    got = await dagu_json(client, "get", {"key": "e"})
    go_text = '{"a":"é","b":"\\u003c\\u0026\\u003e\\u2028"}'.encode()  # Go's escapes
    assert got.endswith(b'"value":' + go_text + b"}")
    assert escaped["hash"] == hashlib.sha256(go_text).hexdigest()



async def test_the_native_scope_limits_are_named_as_the_namespace(client: StateClient) -> None:
    fits = "n" * (1024 - len("dagu/custom/"))
    await dagu(client, "set", {"scope": "custom", "namespace": fits, "key": "k", "value": 1})
    with pytest.raises(KeyTooLong) as too_long:
        await dagu(client, "set", {"scope": "custom", "namespace": fits + "n", "key": "k",
                                   "value": 1})
    assert too_long.value.details == {"path": "$.namespace", "size": 1025, "limit": 1024}
    assert "native scope dagu/custom/<namespace> would be 1025 bytes" in str(too_long.value)
    async with StateClient(settings=client.settings, caller="vault") as vault:
        await vault.claim_namespace("vault", ["dagu/custom/locked"])
    with pytest.raises(ReservedScope) as claimed:
        await dagu(client, "get", {"scope": "custom", "namespace": "locked", "key": "k"})
    assert claimed.value.details == {"path": "$.namespace", "scope": "dagu/custom/locked",
                                     "claimed_by": "vault"}
    assert 'claimed by namespace "vault"' in str(claimed.value)



async def test_scope_namespace_key_and_prefix_are_trimmed_as_dagu_trims_them(
        client: StateClient) -> None:
    written = await dagu(client, "set", {"scope": " custom\t", "namespace": "\u3000team ",
                                         "key": " k ", "value": 1})
    assert (written["scope"], written["namespace"], written["key"]) == ("custom", "team", "k")
    listed = await dagu(client, "list", {"scope": "custom", "namespace": "team",
                                         "prefix": " k"})
    assert [entry["key"] for entry in listed["entries"]] == ["k"]


async def test_a_dagu_write_is_the_native_entry_of_dagu_scope_namespace(
        client: StateClient) -> None:
    for scope, namespace, context in (("dag", "etl", ETL), ("global", "_", None),
                                      ("custom", "team", None),
                                      ("root_dag", "main", {"root_dag_name": "main"})):
        body = {"scope": scope, "key": "jobs/a", "value": {"last_id": 123}}
        if scope == "custom":
            body["namespace"] = namespace
        written = await dagu(client, "set", body, context)
        entry = await client.call("state::get-entry",
                                  {"scope": f"dagu/{scope}/{namespace}", "key": "jobs/a"})
        assert entry["found"] and entry["value"] == {"last_id": 123}, scope
        assert (entry["version"], entry["hash"]) == (written["version"], written["hash"]) \
            == (1, LAST_ID_HASH), scope


async def test_a_diff_write_emits_the_event_a_set_does(client: StateClient,
                                                       store: StateStore) -> None:
    await dagu(client, "set", {"key": "by-set", "value": 1})
    await dagu(client, "set", {"key": "by-set", "value": 2})
    await dagu(client, "diff", {"key": "by-diff", "value": 1})
    await dagu(client, "diff", {"key": "by-diff", "value": 2})
    events = await store.events("dagu/dag/etl")
    seen = {(e.key, e.type, bytes(e.old_value), bytes(e.new_value), e.version) for e in events}
    for key in ("by-set", "by-diff"):
        assert {(k, t, o, n, v) for k, t, o, n, v in seen if k == key} == {
            (key, "state:created", b"null", b"1", 1), (key, "state:updated", b"1", b"2", 2)}


# ---- scopes and namespaces ---------------------------------------------------------------------
async def test_dag_scope_is_the_dags_own_namespace(client: StateClient) -> None:
    await dagu(client, "set", {"key": "k", "value": "parent's"}, {"dag_name": "parent"})
    await dagu(client, "set", {"key": "k", "value": "child's"},
               {"dag_name": "child", "root_dag_name": "parent"})
    parent = await dagu(client, "get", {"key": "k"}, {"dag_name": "parent"})
    child = await dagu(client, "get", {"key": "k"}, {"dag_name": "child", "root_dag_name": "parent"})
    assert (parent["namespace"], parent["value"]) == ("parent", "parent's")
    assert (child["namespace"], child["value"]) == ("child", "child's")
    alone = await dagu(client, "get", {"key": "k"}, {"dag_name": "other"})
    assert alone == {"operation": "get", "scope": "dag", "namespace": "other", "key": "k",
                     "found": False}


async def test_root_dag_scope_is_shared_by_the_whole_run_tree(client: StateClient) -> None:
    child = {"dag_name": "child", "root_dag_name": "parent"}
    written = await dagu(client, "set", {"scope": "root_dag", "key": "k", "value": 7}, child)
    assert (written["scope"], written["namespace"]) == ("root_dag", "parent")
    for context in ({"dag_name": "parent"}, {"dag_name": "parent", "root_dag_name": " parent "},
                    {"dag_name": "sibling", "root_dag_name": "parent"}):
        seen = await dagu(client, "get", {"scope": "root_dag", "key": "k"}, context)
        assert (seen["found"], seen["value"]) == (True, 7), context
    # the child's root_dag write is not in the parent's dag scope, nor in another tree's
    assert not (await dagu(client, "get", {"key": "k"}, {"dag_name": "parent"}))["found"]
    other = await dagu(client, "get", {"scope": "root_dag", "key": "k"}, {"dag_name": "x"})
    assert (other["namespace"], other["found"]) == ("x", False)


async def test_global_scope_defaults_to_namespace_underscore_for_every_dag(
        client: StateClient) -> None:
    written = await dagu(client, "set", {"scope": " global ", "key": "last_run", "value": "r-1"},
                         {"dag_name": "a"})
    assert (written["scope"], written["namespace"]) == ("global", "_")
    for context in ({"dag_name": "b"}, None):
        seen = await dagu(client, "get", {"scope": "global", "key": "last_run"}, context)
        assert (seen["namespace"], seen["value"]) == ("_", "r-1")
    team = await dagu(client, "get", {"scope": "global", "namespace": "team", "key": "last_run"})
    assert (team["namespace"], team["found"]) == ("team", False)


async def test_custom_scope_needs_a_namespace_and_is_its_own_record(
        client: StateClient) -> None:
    error = await refused(client, "set", {"scope": "custom", "key": "k", "value": 1})
    assert str(error) == "state: configuration error: namespace is required for custom scope"
    assert error.details == {"path": "$.namespace"}
    await dagu(client, "set", {"scope": "custom", "namespace": "x", "key": "k", "value": "c"})
    await dagu(client, "set", {"namespace": "x", "key": "k", "value": "d"})  # dag scope, ns x
    custom = await dagu(client, "get", {"scope": "custom", "namespace": " x ", "key": "k"})
    dag = await dagu(client, "get", {"scope": "dag", "namespace": "x", "key": "k"})
    assert (custom["value"], custom["version"], dag["value"], dag["version"]) == ("c", 1, "d", 1)


async def test_an_unsupported_scope_is_refused_by_name(client: StateClient) -> None:
    error = await refused(client, "get", {"scope": "run", "namespace": "n", "key": "k"})
    assert str(error) == 'state: configuration error: unsupported scope "run"'
    assert error.details == {"path": "$.scope"}


async def test_the_namespace_a_scope_needs_comes_from_the_calls_context(
        client: StateClient) -> None:
    for scope, context in (("dag", None), ("dag", {"dag_name": ""}), ("root_dag", {}),
                           ("root_dag", {"root_dag_name": " "})):
        with pytest.raises(InvalidContext) as info:
            await dagu(client, "get", {"scope": scope, "key": "k"}, context)
        assert info.value.details == {"path": "context.dag_name"}, (scope, context)
        assert "dag_name" in str(info.value)
    with pytest.raises(InvalidContext) as info:
        await dagu(client, "get", {"key": "k"}, {"dag_name": 5})
    assert info.value.details == {"path": "context.dag_name"}
    with pytest.raises(InvalidContext) as info:
        await dagu(client, "get", {"scope": "root_dag", "key": "k"}, {"root_dag_name": ["p"]})
    assert info.value.details == {"path": "context.root_dag_name"}
    # a namespace given needs no context
    assert (await dagu(client, "get", {"namespace": "etl", "key": "k"}, None))["found"] is False


# ---- validation texts -------------------------------------------------------------------------
async def test_key_is_required_by_get_set_delete_and_diff(client: StateClient) -> None:
    for action in ("get", "set", "delete", "diff"):
        for body in ({"value": 1}, {"key": " \t", "value": 1}, {"key": None, "value": 1}):
            error = await refused(client, action, body)
            assert str(error) == "state: configuration error: key is required", (action, body)
            assert error.details == {"path": "$.key"}
    listed = await dagu(client, "list", {})
    assert listed["entries"] == []


async def test_value_is_required_by_set_and_diff_and_null_is_a_value(
        client: StateClient) -> None:
    for action in ("set", "diff"):
        error = await refused(client, action, {"key": "k"})
        assert str(error) == f"state: configuration error: value is required for {action}"
        assert error.details == {"path": "$.value"}
    assert (await dagu(client, "set", {"key": "k", "value": None}))["version"] == 1
    assert await dagu_json(client, "get", {"key": "k"}) == (
        b'{"operation":"get","scope":"dag","namespace":"etl","key":"k","found":true,'
        b'"version":1,"hash":"' + hashlib.sha256(b"null").hexdigest().encode()
        + b'","value":null}')
    diff = await dagu(client, "diff", {"key": "k", "value": None})
    assert (diff["changed"], diff["current"], diff["previous"]) == (False, None, None)


async def test_limit_below_zero_or_beyond_an_int32_is_refused(client: StateClient) -> None:
    for action in ("list", "get"):
        error = await refused(client, action, {"key": "k", "limit": -1})
        assert str(error) == \
            "state: configuration error: limit must be greater than or equal to zero"
        assert error.details == {"path": "$.limit"}
    error = await refused(client, "list", {"limit": 2**31})
    assert str(error) == "dag state: invalid ref: limit exceeds 2147483647"
    assert (await dagu(client, "list", {"limit": 2**31 - 1}))["entries"] == []


async def test_a_step_with_several_faults_is_refused_for_the_first_in_daguss_order(
        client: StateClient) -> None:
    """Dagu checks the step's configuration (key, value, limit, scope), then where the entry
    lives (the namespace, from the context when not given), then the key's parts."""
    bad_scope, no_dag = {"scope": "run"}, {"dag_name": None}
    cases: list[tuple[str, dict[str, Any], dict[str, Any] | None, str]] = [
        ("set", {**bad_scope, "limit": -1}, None, "$.key"),  # no key, no value
        ("get", bad_scope, no_dag, "$.key"),
        ("delete", {"key": " "}, no_dag, "$.key"),
        ("set", {**bad_scope, "key": "a//b", "limit": -1}, None, "$.value"),
        ("diff", {**bad_scope, "key": "a//b", "value": 1, "limit": -1}, None, "$.limit"),
        ("get", {**bad_scope, "key": "a//b"}, no_dag, "$.scope"),
        ("get", {"key": "a//b"}, no_dag, "context.dag_name"),
        ("delete", {"key": "a//b"}, {"dag_name": "a/b"}, "context.dag_name"),
        ("get", {"namespace": "..", "key": "a//b"}, None, "$.namespace"),
        ("get", {"namespace": "n", "key": "a//b"}, None, "$.key"),
    ]
    for action, body, context, path in cases:
        with pytest.raises((InvalidRequest, InvalidContext)) as info:
            await dagu(client, action, body, context)
        assert info.value.details["path"] == path, (action, body, context, str(info.value))
    # a refusal is not remembered: the same step is refused again, and with the context it
    # lacked it runs
    for _ in range(2):
        with pytest.raises(InvalidContext):
            await dagu(client, "get", {"key": "a/b"}, no_dag)
    assert (await dagu(client, "get", {"key": "a/b"}, ETL))["found"] is False


async def test_steps_with_long_texts_are_not_kept_in_the_resolution_cache(
        client: StateClient) -> None:
    """Places and keys are resolved once and cached, but a refused step with a key of
    megabytes must not stay in memory (nor a long DAG name): only short texts are cached."""
    resolved = rules._address.cache_info().currsize
    for n in range(3):
        with pytest.raises(KeyTooLong):
            await dagu(client, "get", {"key": f"{n}" + "k" * 200_000})
        await dagu(client, "get", {"namespace": "n", "key": "k"}, {"dag_name": f"{n}" * 2000})
    assert rules._address.cache_info().currsize == resolved
    await dagu(client, "get", {"key": "short"})
    assert rules._address.cache_info().currsize == resolved + 1


async def test_namespaces_with_a_separator_or_dots_are_invalid_refs(client: StateClient) -> None:
    for namespace, quoted in (("a/b", '"a/b"'), ("a\\b", '"a\\\\b"'), (".", '"."'),
                              ("..", '".."'), ("a/\x01", '"a/\\x01"')):
        error = await refused(client, "get", {"namespace": namespace, "key": "k"})
        assert str(error) == f"dag state: invalid ref: invalid namespace {quoted}"
        assert error.details == {"path": "$.namespace"}
    error = await refused(client, "get", {"key": "k"}, {"dag_name": "etl/daily"})
    assert str(error) == 'dag state: invalid ref: invalid namespace "etl/daily"'
    assert error.details == {"path": "context.dag_name"}
    error = await refused(client, "get", {"key": "k"}, {"dag_name": "\u3000"})
    assert str(error) == "dag state: invalid ref: namespace is required"
    assert error.details == {"path": "context.dag_name"}


async def test_keys_are_slash_separated_parts_none_empty_or_dots(client: StateClient) -> None:
    for key, quoted in (("/a", '"/a"'), ("a/", '"a/"'), ("a//b", '"a//b"'),
                        ("a/./b", '"a/./b"'), ("a/../b", '"a/../b"'), ("..", '".."'),
                        ("a\\b", '"a\\\\b"'), ("/\tz\u00a0y", '"/\\tz\\u00a0y"')):
        for action in ("get", "set", "delete", "diff"):
            error = await refused(client, action, {"key": key, "value": 1})
            assert str(error) == f"dag state: invalid ref: invalid key {quoted}", (key, action)
            assert error.details == {"path": "$.key"}
    written = await dagu(client, "set", {"key": " jobs/a.b/c ", "value": 1})
    assert written["key"] == "jobs/a.b/c"
    assert (await dagu(client, "get", {"key": "jobs/a.b/c"}))["found"]


async def test_list_prefixes_follow_the_key_rule(client: StateClient) -> None:
    for prefix, text in (("/jobs", 'invalid key prefix "/jobs"'),
                         ("jo\\bs", 'invalid key prefix "jo\\\\bs"'),
                         ("jobs//", 'invalid key_prefix "jobs/"'),
                         ("jobs/../", 'invalid key_prefix "jobs/.."'),
                         ("a//b", 'invalid key_prefix "a//b"')):
        error = await refused(client, "list", {"prefix": prefix})
        assert str(error) == f"dag state: invalid ref: {text}", prefix
        assert error.details == {"path": "$.prefix"}
    for prefix in ("", " ", "jobs", "jobs/", "jobs/a"):
        assert (await dagu(client, "list", {"prefix": prefix}))["entries"] == []


async def test_unknown_fields_are_refused_by_name(client: StateClient) -> None:
    error = await refused(client, "set", {"key": "k", "value": 1, "valeu": 2})
    assert error.code == "UNKNOWN_FIELD"
    assert error.details == {"path": "$.valeu", "nearest": "value"}
    assert str(error).startswith('$.valeu: unknown field "valeu" (did you mean "value"?); a Dagu '
                                 "state step takes only scope, namespace, key")
    assert "include_values" in str(error)
    assert not (await dagu(client, "get", {"key": "k"}))["found"]
    error = await refused(client, "get", {"key": 5})
    assert error.details == {"path": "$.key"}


async def test_expected_version_takes_an_integer_or_its_decimal_text(
        client: StateClient) -> None:
    await dagu(client, "set", {"key": "k", "value": 1})
    assert (await dagu(client, "set", {"key": "k", "value": 2, "expected_version": "1"}))[
        "version"] == 2
    for bad in ("two", "0x2", "", 2.5, -1, "-1"):
        for action, update in (("set", None), ("diff", None), ("diff", False)):
            error = await refused(client, action, {"key": "k", "value": 3, "update": update,
                                                   "expected_version": bad})
            assert error.details["path"] == "$.expected_version", (bad, action, update)
    assert (await dagu(client, "get", {"key": "k"}))["version"] == 2


# ---- get: required and default ------------------------------------------------------------------
async def test_a_required_get_of_a_missing_key_is_not_found(client: StateClient) -> None:
    with pytest.raises(NotFound) as info:
        await dagu(client, "get", {"key": "k", "required": True, "default": 1})
    assert str(info.value) == "dag state: not found"
    assert info.value.details["path"] == "$.key"
    await dagu(client, "set", {"key": "k", "value": 2})
    assert (await dagu(client, "get", {"key": "k", "required": True}))["value"] == 2


async def test_a_miss_reports_the_default_normalized_only_when_one_is_given(
        client: StateClient) -> None:
    assert await dagu_json(client, "get", {"key": "k"}) == (
        b'{"operation":"get","scope":"dag","namespace":"etl","key":"k","found":false}')
    assert await dagu_json(client, "get", {"key": "k", "default": {"b": [], "a": 0}}) == (
        b'{"operation":"get","scope":"dag","namespace":"etl","key":"k","found":false,'
        b'"value":{"a":0,"b":[]}}')
    assert (await dagu_json(client, "get", {"key": "k", "default": None})).endswith(
        b'"found":false,"value":null}')
    await dagu(client, "set", {"key": "k", "value": "stored"})
    assert (await dagu(client, "get", {"key": "k", "default": "d"}))["value"] == "stored"


# ---- set: optimistic concurrency ----------------------------------------------------------------
async def test_create_only_and_a_stale_expected_version_are_conflicts(
        client: StateClient) -> None:
    first = await dagu(client, "set", {"key": "k", "value": 1, "create_only": True})
    assert (first["version"], first["created"]) == (1, True)
    for body, expected in (({"create_only": True}, 0), ({"expected_version": 3}, 3),
                           ({"expected_version": 0}, 0)):
        with pytest.raises(Conflict) as info:
            await dagu(client, "set", {"key": "k", "value": 2, **body})
        assert str(info.value) == "dag state: conflict"
        assert info.value.details == {"expected_version": expected, "current_version": 1}
    assert (await dagu(client, "get", {"key": "k"}))["version"] == 1
    with pytest.raises(Conflict):
        await dagu(client, "set", {"key": "new", "value": 1, "expected_version": 1})
    assert (await dagu(client, "set", {"key": "new", "value": 1, "expected_version": 0}))[
        "created"] is True
    # Both rules hold at once: create_only does not set expected_version aside.
    with pytest.raises(Conflict) as both:
        await dagu(client, "set", {"key": "newer", "value": 1, "create_only": True,
                                   "expected_version": 1})
    assert both.value.details == {"expected_version": 1, "current_version": 0}
    assert (await dagu(client, "get", {"key": "newer"}))["found"] is False


async def test_twenty_concurrent_read_modify_write_loops_lose_no_increment(
        client: StateClient) -> None:
    await dagu(client, "set", {"key": "counter", "value": 0})
    conflicts = 0

    async def increment_ten_times() -> None:
        nonlocal conflicts
        for _ in range(10):
            while True:
                read = await dagu(client, "get", {"key": "counter"})
                try:
                    await dagu(client, "set", {"key": "counter", "value": read["value"] + 1,
                                               "expected_version": read["version"]})
                    break
                except Conflict as exc:
                    assert exc.details["current_version"] > read["version"]
                    conflicts += 1

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tasks:
            for _ in range(20):
                tasks.start_soon(increment_ten_times)
    final = await dagu(client, "get", {"key": "counter"})
    assert (final["value"], final["version"]) == (200, 201)
    assert conflicts > 0  # the loops did race (each conflict was retried)


# ---- delete ---------------------------------------------------------------------------------------
async def test_delete_reports_whether_the_key_existed(client: StateClient) -> None:
    await dagu(client, "set", {"key": "k", "value": {"x": 1}})
    await dagu(client, "set", {"key": "nothing", "value": None})
    assert await dagu_json(client, "delete", {"key": "k"}) == (
        b'{"operation":"delete","scope":"dag","namespace":"etl","key":"k","deleted":true}')
    assert (await dagu(client, "delete", {"key": "k"}))["deleted"] is False
    assert (await dagu(client, "delete", {"key": "nothing"}))["deleted"] is True  # (a null)
    assert (await dagu(client, "delete", {"key": "nothing"}))["deleted"] is False
    recreated = await dagu(client, "set", {"key": "k", "value": 2})
    assert (recreated["version"], recreated["created"]) == (1, True)


async def test_delete_honours_expected_version_as_set_does(client: StateClient) -> None:
    """A stale expected_version deletes nothing (`dag state: conflict` naming both versions);
    the current one deletes; 0 (a missing key's version) deletes nothing and conflicts with
    an entry that exists."""
    await dagu(client, "set", {"key": "k", "value": 1})
    await dagu(client, "set", {"key": "k", "value": 2})
    for expected in (1, 3, 0, "1"):
        with pytest.raises(Conflict) as info:
            await dagu(client, "delete", {"key": "k", "expected_version": expected})
        assert str(info.value) == "dag state: conflict"
        assert info.value.details == {"expected_version": int(expected), "current_version": 2}
    assert (await dagu(client, "get", {"key": "k"}))["value"] == 2
    assert (await dagu(client, "delete", {"key": "k", "expected_version": "2"}))["deleted"]
    assert (await dagu(client, "get", {"key": "k"}))["found"] is False
    assert (await dagu(client, "delete", {"key": "k", "expected_version": 0}))[
        "deleted"] is False
    with pytest.raises(Conflict) as info:
        await dagu(client, "delete", {"key": "k", "expected_version": 1})
    assert info.value.details == {"expected_version": 1, "current_version": 0}


# ---- list -----------------------------------------------------------------------------------------
async def test_list_prints_every_entry_in_key_order_with_go_times(client: StateClient) -> None:
    for key in ("jobs/b", "jobs/a", "cursor"):
        await dagu(client, "set", {"key": key, "value": {"k": key}})
    text = await dagu_json(client, "list", {})
    listed = msgspec.json.decode(text)
    assert text.startswith(b'{"operation":"list","scope":"dag","namespace":"etl","entries":[')
    assert [e["key"] for e in listed["entries"]] == ["cursor", "jobs/a", "jobs/b"]
    first = listed["entries"][0]
    assert list(first) == ["scope", "namespace", "key", "version", "hash", "createdAt",
                           "updatedAt"]
    native = await client.call("state::get-entry", {"scope": "dagu/dag/etl", "key": "cursor"})
    assert (first["scope"], first["namespace"], first["version"], first["hash"]) == (
        "dag", "etl", 1, native["hash"])
    assert first["createdAt"] == go_time(native["created_at"])
    assert GO_TIME.fullmatch(first["createdAt"]) and GO_TIME.fullmatch(first["updatedAt"])


async def test_list_filters_by_prefix_caps_at_limit_and_includes_values_on_request(
        client: StateClient) -> None:
    for key in ("jobs/a", "jobs/b", "jobs/c", "jobsx", "other"):
        await dagu(client, "set", {"key": key, "value": {"k": key}})
    jobs = await dagu(client, "list", {"prefix": " jobs/ "})
    assert jobs["prefix"] == "jobs/"
    assert [e["key"] for e in jobs["entries"]] == ["jobs/a", "jobs/b", "jobs/c"]
    assert "value" not in jobs["entries"][0]
    loose = await dagu(client, "list", {"prefix": "jobs"})
    assert [e["key"] for e in loose["entries"]] == ["jobs/a", "jobs/b", "jobs/c", "jobsx"]
    capped = await dagu(client, "list", {"prefix": "jobs/", "limit": 2, "include_values": True})
    assert [(e["key"], e["value"]) for e in capped["entries"]] == [
        ("jobs/a", {"k": "jobs/a"}), ("jobs/b", {"k": "jobs/b"})]
    other = await dagu(client, "list", {}, {"dag_name": "other"})
    assert other == {"operation": "list", "scope": "dag", "namespace": "other", "entries": []}


async def test_list_reads_past_one_native_page(client: StateClient, store: StateStore) -> None:
    keys = [f"k{i:04d}" for i in range(1203)]
    async with anyio.create_task_group() as tasks:
        for key in keys:
            tasks.start_soon(store.set, "dagu/dag/etl", key, 1)
    everything = await dagu(client, "list", {})
    assert [e["key"] for e in everything["entries"]] == keys
    capped = await dagu(client, "list", {"limit": 1100})
    assert [e["key"] for e in capped["entries"]] == keys[:1100]


def test_times_are_written_as_gos_rfc3339nano() -> None:
    assert go_time("2026-12-01T03:59:52.478Z") == "2026-12-01T03:59:52.478Z"
    assert go_time("2026-12-01T03:59:52.100Z") == "2026-12-01T03:59:52.1Z"
    assert go_time("2026-12-01T03:59:52.000Z") == "2026-12-01T03:59:52Z"


# ---- diff -----------------------------------------------------------------------------------------
async def test_diff_writes_a_new_or_changed_value_and_reports_what_was_there(
        client: StateClient, store: StateStore) -> None:
    new = await dagu_json(client, "diff", {"key": "cfg", "value": {"b": 2, "a": 1}})
    assert new == (b'{"operation":"diff","scope":"dag","namespace":"etl","key":"cfg",'
                   b'"changed":true,"foundPrevious":false,"version":1,"hash":"'
                   + AB_HASH.encode() + b'","current":{"a":1,"b":2}}')
    same = await dagu(client, "diff", {"key": "cfg", "value": {"a": 1, "b": 2}})
    assert same == {"operation": "diff", "scope": "dag", "namespace": "etl", "key": "cfg",
                    "changed": False, "foundPrevious": True, "previousVersion": 1,
                    "version": 1, "hash": AB_HASH, "previous": {"a": 1, "b": 2},
                    "current": {"a": 1, "b": 2}}
    changed = await dagu(client, "diff", {"key": "cfg", "value": {"last_id": 123}})
    assert (changed["changed"], changed["previousVersion"], changed["previous"],
            changed["version"], changed["hash"]) == (True, 1, {"a": 1, "b": 2}, 2, LAST_ID_HASH)
    assert len(await store.events("dagu/dag/etl")) == 2  # the unchanged diff wrote nothing


async def test_diff_with_update_false_writes_nothing(client: StateClient,
                                                     store: StateStore) -> None:
    missing = await dagu(client, "diff", {"key": "cfg", "value": 1, "update": False})
    assert missing == {"operation": "diff", "scope": "dag", "namespace": "etl", "key": "cfg",
                       "changed": True, "foundPrevious": False, "current": 1}
    await dagu(client, "set", {"key": "cfg", "value": {"last_id": 123}})
    changed = await dagu(client, "diff", {"key": "cfg", "value": 2, "update": False})
    assert (changed["changed"], changed["foundPrevious"], changed["previousVersion"],
            changed["version"], changed["hash"], changed["previous"], changed["current"]) == (
        True, True, 1, 1, LAST_ID_HASH, {"last_id": 123}, 2)
    same = await dagu(client, "diff", {"key": "cfg", "value": {"last_id": 123}, "update": False})
    assert (same["changed"], same["version"]) == (False, 1)
    assert (await dagu(client, "get", {"key": "cfg"}))["value"] == {"last_id": 123}
    assert len(await store.events("dagu/dag/etl")) == 1


async def test_diff_expected_version_conflicts_before_comparing(client: StateClient) -> None:
    for update in (True, False):
        key = f"cfg-{update}"
        with pytest.raises(Conflict) as info:  # a missing key is version 0
            await dagu(client, "diff", {"key": key, "value": 1, "expected_version": 2,
                                        "update": update})
        assert str(info.value) == "dag state: conflict"
        assert info.value.details == {"expected_version": 2, "current_version": 0}
        assert (await dagu(client, "diff", {"key": key, "value": 1, "expected_version": 0,
                                            "update": update}))["changed"] is True
        await dagu(client, "set", {"key": key, "value": 1})
        version = (await dagu(client, "get", {"key": key}))["version"]
        with pytest.raises(Conflict) as info:  # stale, though the value is unchanged
            await dagu(client, "diff", {"key": key, "value": 1, "expected_version": version + 1,
                                        "update": update})
        assert info.value.details == {"expected_version": version + 1,
                                      "current_version": version}
        matched = await dagu(client, "diff", {"key": key, "value": 5, "update": update,
                                              "expected_version": str(version)})
        assert (matched["changed"], matched["version"]) == (True, version + update)


# ---- the service's value limit (last: it starts a service of its own) -------------------------
async def test_a_value_over_max_value_bytes_is_too_large(redis_server: RedisServer) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=f"t{uuid.uuid4().hex[:12]}",
                        partitions=4, max_value_bytes=64)
    async with small_service(settings) as small:
        for value, size in (("x" * 100, 102), ("<" * 20, 122)):  # (Go escapes < as \u003c)
            with pytest.raises(ValueTooLarge) as info:
                await dagu(small, "set", {"key": "k", "value": value})
            assert str(info.value) == f"dag state: value too large: {size} bytes exceeds 64"
            assert (info.value.details["size"], info.value.details["limit"]) == (size, 64)
        assert not (await dagu(small, "get", {"key": "k"}))["found"]
        # a default is normalized (and sized) only when a miss uses it; required beats it
        big = {"key": "k", "default": "x" * 100}
        with pytest.raises(ValueTooLarge):
            await dagu(small, "get", big)
        with pytest.raises(NotFound):
            await dagu(small, "get", {**big, "required": True})
        await dagu(small, "set", {"key": "k", "value": 1})
        assert (await dagu(small, "get", big))["value"] == 1


@asynccontextmanager
async def small_service(settings: Settings) -> AsyncIterator[StateClient]:
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as opened:
        yield opened
