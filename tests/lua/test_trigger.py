"""state::register-trigger's targets (trigger.lua's callers): `service`, `function_id` and a
bus condition's `condition_service` / `condition_function_id` follow the bus's name rules,
refused with INVALID_REQUEST naming the field, the problem and the limit, before anything is
stored; in `acl` mode a principal may target only services it may call."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.context import CallContext
from stateworker.keys import MAX_SERVICE_BYTES
from stateworker.state import functions
from tests.calls import principal as make_principal

pytestmark = pytest.mark.anyio

BASE = {"function_id": "reactor::on_change", "service": "reactor"}
HOSTILE = [
    ("reactor{p0}", "'{'"), ("re}actor", "'}'"), ("reactor:done:x", "':done:'"),
    ("react\0or", "NUL"), ("../reactor", "'/'"), ("reactor x", "whitespace"),
    ("reactor\n", "whitespace"), ("reactor\t", "whitespace"), ("\u00a0reactor", "whitespace"),
]


async def refused(store: StateStore, body: dict[str, Any]) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::register-trigger", body)
    assert (await store.call("state::list-triggers", {})) == {"triggers": []}
    return caught.value


@pytest.mark.parametrize(("name", "problem"), HOSTILE)
@pytest.mark.parametrize("field", ["service", "function_id"])
async def test_a_hostile_target_name_is_refused_naming_the_field(
        store: StateStore, field: str, name: str, problem: str) -> None:
    error = await refused(store, {**BASE, field: name})
    assert error.code == "INVALID_REQUEST"
    assert error.details["path"] == f"$.{field}"
    assert error.message.startswith(f"$.{field}: ")
    assert problem in error.message
    limit = MAX_SERVICE_BYTES if field == "service" else 256
    assert error.details["limit"] == limit and f"at most {limit} bytes" in error.message


@pytest.mark.parametrize(("field", "name"), [
    ("condition_service", "cond{x}"), ("condition_service", "a b"),
    ("condition_function_id", "cond::x:done:1"), ("condition_function_id", "a/b"),
])
async def test_a_conditions_target_follows_the_same_rules(store: StateStore, field: str,
                                                          name: str) -> None:
    config = {"condition_function_id": "checks::ok", field: name}
    error = await refused(store, {**BASE, "config": config})
    assert error.code == "INVALID_REQUEST" and error.details["path"] == f"$.config.{field}"


async def test_a_service_name_is_at_most_64_bytes(store: StateStore) -> None:
    error = await refused(store, {**BASE, "service": "s" * (MAX_SERVICE_BYTES + 1)})
    assert error.code == "INVALID_REQUEST" and error.details["path"] == "$.service"
    assert error.details["limit"] == MAX_SERVICE_BYTES and "64 bytes" in error.message
    for empty in ("service", "function_id"):
        assert (await refused(store, {**BASE, empty: ""})).details["path"] == f"$.{empty}"
    ok = {**BASE, "service": "s" * MAX_SERVICE_BYTES, "function_id": "svc::fn-1.v2_x"}
    assert (await store.call("state::register-trigger", {**ok, "id": "ok"})) == {"id": "ok"}
    barrier = {"condition_function_id": "state::barrier",
               "condition_config": {"id": "b", "expect": 2}}
    assert await store.call("state::register-trigger", {**BASE, "id": "b", "config": barrier})


async def test_in_acl_mode_a_principal_targets_only_services_it_may_call(
        store: StateStore) -> None:
    async def register(principal: str, body: dict[str, Any]) -> Any:
        raw = await functions.call_json(store.state, "state::register-trigger",
                                        msgspec.json.encode(body),
                                        CallContext(principal=principal), store.catalog)
        return msgspec.json.decode(raw)

    await make_principal(store, "ops", allow=("read", "triggers"), services=("reactor",))
    await make_principal(store, "mallory", allow=("read", "triggers"))
    assert await register("ops", {**BASE, "id": "t1"}) == {"id": "t1"}
    for principal, body, path in [
        ("mallory", {**BASE, "id": "t2"}, "$.service"),
        ("ops", {**BASE, "id": "t3", "config": {"condition_function_id": "c::f",
                                                "condition_service": "billing"}},
         "$.config.condition_service"),
    ]:
        with pytest.raises(StateError) as denied:
            await register(principal, body)
        assert denied.value.code == "PERMISSION_DENIED"
        assert denied.value.details["path"] == path
        assert denied.value.details["principal"] == principal
    listed = await store.call("state::list-triggers", {})
    assert [t["id"] for t in listed["triggers"]] == ["t1"]
