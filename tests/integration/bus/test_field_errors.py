"""Errors that name a field say where it is in `details.path`: a bus entry's own fields by
name (`deadline_ms`, `context.execution_id`), a body's by JSON path (`$.max_key`). A field a
native function does not take is UNKNOWN_FIELD naming the nearest known one, in-process and
over the bus, for every native function (specs.NATIVE), and nothing is written."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateClient, StateError, StateStore, UnknownField
from stateworker.app.service import StateService
from stateworker.specs import NATIVE, Spec
from tests.integration.busproto import receive

pytestmark = pytest.mark.anyio


# ---- a bus entry's fields ---------------------------------------------------------------------
@pytest.mark.parametrize(("fields", "path"), [
    ({"fn": None}, "fn"),
    ({"fn": b"state::\xff"}, "fn"),
    ({"body": None}, "body"),
    ({"deadline_ms": "soon"}, "deadline_ms"),
    ({"context": "{"}, "context"),
    ({"context": "[1]"}, "context"),
    ({"context": msgspec.json.encode({"execution_id": "e" * 257})}, "context.execution_id"),
    ({"id": "i" * 257}, "id"),
    ({"id": ""}, "id"),
    ({"caller": "c" * 257}, "caller"),
    ({"caller": b"bob\xff"}, "caller"),
    ({"fn": "state::" + "f" * 250}, "fn"),
    ({"deadline_ms": "9_999_999_999_999"}, "deadline_ms"),
    ({"deadline_ms": " 9999999999999 "}, "deadline_ms"),
    ({"deadline_ms": "9" * 19}, "deadline_ms"),
    ({"context": "[" * 600 + "]" * 600}, "context"),
])
async def test_an_entry_field_at_fault_is_named_by_details_path(
        service: StateService, raw: aredis.Redis, prefix: str, fields: dict[str, Any],
        path: str) -> None:
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    entry: dict[str, Any] = {"id": uuid.uuid4().hex, "fn": "state::get",
                             "body": b'{"scope":"s","key":"k"}', "reply": reply, **fields}
    await raw.xadd(f"{prefix}:bus:state", {k: v for k, v in entry.items() if v is not None})
    error = (await receive(raw, reply))["error"]
    assert error["code"] == "INVALID_REQUEST", error
    assert error["details"]["path"] == path and "field" not in error["details"]
    assert error["message"].startswith(path), error
    if any(word in error["message"] for word in ("limit", "at most", "deep")):
        assert "limit" in error["details"] or "size" in error["details"], error


async def test_what_an_entry_field_may_hold_names_its_limit(
        service: StateService, raw: aredis.Redis, prefix: str) -> None:
    """The limits of `fn`, `deadline_ms`, a nested `context` and an empty `id`, as a caller
    reads them."""
    cases: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
        ({"fn": "x" * 300}, "fn: is 300 bytes, more than the limit of 256 bytes",
         {"path": "fn", "size": 300, "limit": 256}),
        ({"deadline_ms": "1_000"}, "deadline_ms: must be an integer of at most 18 digits "
         '(epoch milliseconds), got "1_000"', {"path": "deadline_ms", "limit": 18}),
        ({"context": "{\"a\":" * 600 + "1" + "}" * 600}, "context: nested more than 512 "
         "levels deep (the limit is 512)", {"path": "context", "limit": 512}),
        ({"id": ""}, "id: the call has an empty `id` field (a unique id per logical call)",
         {"path": "id"}),
    ]
    for fields, message, details in cases:
        reply = f"{prefix}:reply:{uuid.uuid4().hex}"
        entry: dict[str, Any] = {"id": uuid.uuid4().hex, "fn": "state::get",
                                 "body": b'{"scope":"s","key":"k"}', "reply": reply, **fields}
        await raw.xadd(f"{prefix}:bus:state", entry)
        error = (await receive(raw, reply))["error"]
        assert (error["message"], error["details"]) == (message, details), error


# ---- unknown fields of every native function ----------------------------------------------------
def misspelt(spec: Spec) -> list[tuple[str, str]]:
    """(a misspelling, the field it misspells) of each of the function's fields: its last
    letter dropped (`max_key`, `isolatio`, `expected_versio`)."""
    return [(field[:-1], field) for field in sorted(spec.fields)]


CASES = [(spec, wrong, right) for spec in NATIVE for wrong, right in misspelt(spec)]
ISSUE = [("state::set", "max_key", "max_keys"), ("state::get", "isolaton", "isolation"),
         ("state::update", "expected_verison", "expected_version"),
         ("state::delete", "expected_verison", "expected_version"),
         ("state::list-entries", "limt", "limit"), ("state::list_groups", "scope", None)]


def check(error: StateError, wrong: str, right: str | None) -> None:
    assert isinstance(error, UnknownField) and error.code == "UNKNOWN_FIELD"
    assert error.details == {"path": f"$.{wrong}", "nearest": right}
    assert error.message.startswith(f'$.{wrong}: unknown field "{wrong}"')
    if right is not None:
        assert f'(did you mean "{right}"?)' in error.message


@pytest.mark.parametrize(("spec", "wrong", "right"), CASES,
                         ids=[f"{spec.name}-{wrong}" for spec, wrong, _ in CASES])
async def test_an_unknown_field_is_refused_naming_the_nearest(
        store: StateStore, scope: str, spec: Spec, wrong: str, right: str) -> None:
    body = {"scope": scope, "key": "k", "value": 1, wrong: 1}
    with pytest.raises(StateError) as refused:
        await store.call(spec.name, {k: v for k, v in body.items()
                                     if k in spec.fields or k == wrong})
    check(refused.value, wrong, right)
    assert await store.list_groups() == []  # nothing written


@pytest.mark.parametrize(("fn", "wrong", "right"), ISSUE)
async def test_an_unknown_field_is_refused_over_the_bus(
        client: StateClient, store: StateStore, scope: str, fn: str, wrong: str,
        right: str | None) -> None:
    fields = next(spec.fields for spec in NATIVE if spec.name == fn)
    body = {k: v for k, v in {"scope": scope, "key": "k", "value": 1, "ops": [
        {"type": "set", "path": "a", "value": 1}]}.items() if k in fields}
    with pytest.raises(UnknownField) as refused:
        await client.call(fn, {**body, wrong: 3})
    check(refused.value, wrong, right)
    assert await store.list_groups() == []


@pytest.mark.parametrize(("body", "path", "nearest"), [
    ({"ops": [{"type": "increment", "path": "n", "by": 1},
              {"type": "set", "path": "a", "valeu": 1}]}, "$.ops[1].valeu", "value"),
    ({"ops": [{"type": "increment", "path": "n", "amount": 1}]}, "$.ops[0].amount", None),
])
async def test_an_unknown_field_of_an_op_is_refused_and_no_op_applies(
        client: StateClient, store: StateStore, scope: str, body: dict[str, Any], path: str,
        nearest: str | None) -> None:
    with pytest.raises(UnknownField) as refused:
        await client.call("state::update", {"scope": scope, "key": "k", **body})
    assert refused.value.details == {"path": path, "nearest": nearest}
    assert await store.get(scope, "k") is None


async def test_an_unknown_field_of_a_trigger_config_is_refused(client: StateClient) -> None:
    with pytest.raises(UnknownField) as refused:
        await client.call("state::register-trigger", {
            "function_id": "audit::seen", "service": "audit",
            "config": {"scope": "orders", "key_prefx": "o-"}})
    assert refused.value.details == {"path": "$.config.key_prefx", "nearest": "key_prefix"}
    assert "key_prefix" in refused.value.message and "event_types" in refused.value.message
    assert (await client.call("state::list-triggers", {}))["triggers"] == []


async def test_the_fields_iii_documents_stay_accepted(client: StateClient, store: StateStore,
                                                      scope: str) -> None:
    await client.call("state::set", {"scope": scope, "key": "k", "data": {"n": 1}})
    assert await client.call("state::get", {"scope": scope, "key": "k"}) == {"n": 1}
    claimed = await store.call("state::claim-namespace", {
        "functions_prefix": "billing", "scopes": [scope + "-b"],
        "_caller_worker_id": "billing"}, caller="billing")
    assert claimed["scopes"] == [scope + "-b"]
    released = await store.call("state::release-namespace", {
        "scopes": [scope + "-b"], "_caller_worker_id": "billing"}, caller="billing")
    assert released["released"] == [scope + "-b"]
    await client.call("state::set", {"scope": scope, "key": "j", "value": 1, "isolation": None})
    assert await client.call("state::get", {"scope": scope, "key": "j"}) == 1


# ---- a missing field is named by its own path (FUNCTIONS.md: `$.ops[2].by`) ---------------------
@pytest.mark.parametrize(("fn", "body", "path"), [
    ("state::get", {"scope": "s"}, "$.key"),
    ("state::delete-by-topic", {"scope": "s"}, "$.topic_pattern"),
    ("state::update", {"scope": "s", "key": "k", "ops": [
        {"type": "set", "path": "a", "value": 1}, {"type": "set", "path": "b"},
        {"type": "increment", "path": "n"}]}, "$.ops[2].by"),
    ("state::update", {"scope": "s", "key": "k", "ops": [{"path": "a"}]}, "$.ops[0].type"),
    ("state::transaction", {"scope": "s", "ops": [{"op": "set", "value": 1}]}, "$.ops[0].key"),
    ("state::set-many", {"scope": "s", "entries": [{"key": "a", "value": 1}, {"key": "b"}]},
     "$.entries[1].value"),
    ("state::register-trigger", {"service": "audit", "config": {}}, "$.function_id"),
])
async def test_a_missing_field_is_named_by_its_path(
        client: StateClient, store: StateStore, fn: str, body: dict[str, Any],
        path: str) -> None:
    with pytest.raises(StateError) as refused:
        await client.call(fn, body)
    assert (refused.value.code, refused.value.details) == ("INVALID_REQUEST", {"path": path})
    field = path.rpartition(".")[2]
    assert refused.value.message == f"{path}: the field `{field}` is required"
    assert await store.list_groups() == []


async def test_a_barrier_config_missing_its_id_names_the_id(client: StateClient) -> None:
    with pytest.raises(StateError) as refused:
        await client.call("state::barrier", {"event": {"key": "a"},
                                             "condition_config": {"expect": 2}})
    assert (refused.value.code, refused.value.details) == (
        "BARRIER_CONFIG", {"path": "$.condition_config.id"})


# ---- an op's unknown field is named against that op's own fields --------------------------------
@pytest.mark.parametrize(("fn", "op", "path", "fields"), [
    ("state::update", {"type": "set", "path": "a", "value": 1, "by": 2}, "$.ops[0].by",
     "type, path, value"),
    ("state::transaction", {"op": "delete", "key": "k", "value": 1}, "$.ops[0].value",
     "op, key, expected_version"),
])
async def test_a_field_of_another_kind_of_op_is_unknown_to_this_one(
        client: StateClient, store: StateStore, fn: str, op: dict[str, Any], path: str,
        fields: str) -> None:
    """`by` is an increment's field, not a set's: the refusal names the set's fields, and
    never offers the refused field itself as the nearest known one."""
    body = {"scope": "s", "ops": [op]} | ({"key": "k"} if fn == "state::update" else {})
    with pytest.raises(UnknownField) as refused:
        await client.call(fn, body)
    wrong = path.rpartition(".")[2]
    assert refused.value.details == {"path": path, "nearest": None}
    assert refused.value.message == (
        f'{path}: unknown field "{wrong}"; {path.rpartition(".")[0]} takes only {fields}')
    assert await store.list_groups() == []
