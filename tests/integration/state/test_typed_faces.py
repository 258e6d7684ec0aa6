"""The typed faces derived from the specs: each function's typed method (fields by position
and keyword, call options by keyword) and `typed(spec, request)`, in-process and over the
bus, answer as the function's JSON does."""

from __future__ import annotations

import datetime
import decimal

import msgspec
import pytest

from stateworker import StateClient, StateStore, specs
from stateworker.engines.dagu import specs as dagu
from stateworker.engines.dagu.schemas import DaguRequest
from stateworker.engines.moco import specs as moco
from stateworker.engines.moco.schemas import KeyRequest, SetStateRequest
from stateworker.errors import Conflict, UnknownFunction
from stateworker.schemas import GetEntryRequest, SetOp, SetRequest, UpdateRequest

pytestmark = pytest.mark.anyio


async def test_the_generated_methods_run_their_functions_on_both_faces(
        store: StateStore, client: StateClient, scope: str) -> None:
    for face, key in ((store, "in-process"), (client, "bus")):
        when = datetime.date(2026, 12, 1)
        await face.set(scope, key, {"n": 1, "on": when}, topic="t")
        updated = await face.update(scope, key, [{"type": "increment", "path": "n", "by": 2}])
        assert updated["new_value"] == {"n": 3, "on": when}  # tagged types converted back
        page = await face.list_entries(scope, include_values=True)
        assert [(e["key"], e["value"]["n"]) for e in page["entries"]
                if e["key"] == key] == [(key, 3)]
        assert await face.diff(scope, key, {"n": 3, "on": when}, update=False) == {
            "changed": False, "found_previous": True, "previous_version": 2,
            "previous": {"n": 3, "on": when}}
        assert await face.update_topic(scope, key, "u") == {"updated": True}
        assert await face.delete_by_topic(scope, "u") == {"deleted": 1}
        assert scope not in (await face.list_namespaces(pattern=scope))["namespaces"]
        registered = await face.register_trigger("f", "nowhere", config={"scope": scope},
                                                 id=f"{scope}-{key}")
        assert registered == {"id": f"{scope}-{key}"}
        assert f"{scope}-{key}" in [t["id"] for t in (await face.list_triggers())["triggers"]]
        assert await face.unregister_trigger(f"{scope}-{key}") == {
            "id": f"{scope}-{key}", "removed": True}


async def test_a_generated_method_takes_call_options_and_refuses_extra_positions(
        client: StateClient, scope: str) -> None:
    await client.set(scope, "k", decimal.Decimal("1.50"), call_id=f"{scope}-1", timeout=5)
    again = await client.set(scope, "k", decimal.Decimal("1.50"), call_id=f"{scope}-1")
    assert again["version"] == 1  # the same call id: the recorded reply, not a second write
    with pytest.raises(Conflict):
        await client.set(scope, "k", 2, expected_version=7)
    with pytest.raises(TypeError, match="at most 2 positional"):
        await client.get(scope, "k", "extra")


async def test_typed_calls_take_and_give_the_specs_structs(
        store: StateStore, client: StateClient, scope: str) -> None:
    for face, key in ((store, "in-process"), (client, "bus")):
        set_result = await face.typed(specs.SET, SetRequest(scope, key,
                                                            value=msgspec.Raw(b'{"a":[]}')))
        assert set_result.new_value == msgspec.Raw(b'{"a":[]}') and set_result.created
        update = UpdateRequest(scope, key, ops=[SetOp("b", msgspec.Raw(b"1"))], expected_version=1)
        assert (await face.typed(specs.UPDATE, update)).version == 2
        entry = await face.typed(specs.GET_ENTRY, GetEntryRequest(scope, key))
        assert (entry.found, entry.version, bytes(entry.value)) == (True, 2, b'{"a":[],"b":1}')
        context = {"user_id": "ann", "dag_name": "etl"}
        await face.typed(moco.SET_STATE, SetStateRequest(
            namespace=scope, key=key, value=msgspec.Raw(b"7")), context=context)
        assert await face.typed(moco.GET_STATE, KeyRequest(namespace=scope, key=key),
                                context=context) == msgspec.Raw(b"7")
        got = await face.typed(dagu.GET, DaguRequest(key=key), context=context)
        assert (got.operation, got.namespace, got.found) == ("get", "etl", False)


async def test_a_typed_call_of_a_spec_not_served_is_unknown(store: StateStore) -> None:
    spec = specs.Spec("state::nope", "nope", specs.s.GetRequest, msgspec.Raw, "none")
    with pytest.raises(UnknownFunction, match='"state::nope" is not served'):
        await store.typed(spec, specs.s.GetRequest("s", "k"))
