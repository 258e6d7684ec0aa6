"""Second red-team review of `acl` mode (docs/security.md): the holes it found, closed since
(each test fails when its hole opens again), and two probes that held."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from stateworker.errors import PermissionDenied, StateError
from stateworker.keys import bus_stream
from stateworker.state.tenancy import principals
from tests.integration.acl import client_of, principal
from tests.integration.acl import role as _role
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def _bodies(state: Any, service: str) -> list[bytes]:
    """The bodies of the handler calls the dispatcher XADDed to `service`'s stream."""
    flat = await state.conn.execute("XRANGE", bus_stream(state.settings.prefix, service),
                                    "-", "+")
    return [dict(zip(fields[::2], fields[1::2], strict=True)).get(b"body", b"")
            for _, fields in flat]


async def _delivered(state: Any, service: str, count: int) -> list[bytes]:
    """Wait until `service`'s stream holds `count` handler calls; their bodies."""
    async def enough() -> bool:
        return len(await _bodies(state, service)) >= count

    await until(enough, 30, f"{count} handler calls on {service}")
    return await _bodies(state, service)


def _barrier_key(state: Any, barrier_id: str) -> str:
    return str(state.keys.barrier_partition(barrier_id).barrier(barrier_id))


async def test_barriers_are_their_principals_own(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A barrier was one by its id whoever arrived: mallory (read on `mallory*` only) joined
    alice's payroll barrier, by a trigger of hers or a state::barrier call, and read the
    payroll values it carried. Now a principal's barriers are `<principal>/<id>`."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["payroll*"], ["alice-svc"])
    alices_all = await _role(state, ["triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read", "write"], ["mallory*"])
    fan_in = await _role(state, ["state::barrier", "triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    alice, alice_url = await principal(state, acl_redis, [alices, alices_all])
    mallory, mallory_url = await principal(state, acl_redis, [mallorys, fan_in])
    payroll, barrier_id = f"payroll-{scope}", f"month-end-{scope}"
    config = {"id": barrier_id, "expect": 2}
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_alice.call("state::register-trigger", {
            "id": "alice-payroll", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": payroll, "condition_function_id": "state::barrier",
                       "condition_config": config}})
        await as_writer.set(payroll, "ceo", {"salary": 987654321})
        alices_barrier = _barrier_key(state, f"{alice}/{barrier_id}")
        await until(lambda: state.conn.execute("EXISTS", alices_barrier), 30,
                    "alice's arrival at her barrier")
        decision = await as_mallory.call("state::barrier", {
            "event": {"key": "mallory"}, "condition_config": config})
        assert decision["decision"] == "skip"  # 1/2 of a barrier of her own
        assert b"987654321" not in msgspec.json.encode(decision)
        assert await state.conn.execute(
            "EXISTS", _barrier_key(state, f"{mallory}/{barrier_id}")) == 1
        assert await state.conn.execute("EXISTS", _barrier_key(state, barrier_id)) == 0


async def test_a_trigger_stops_delivering_when_its_read_grant_is_withdrawn(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """may_read was asked once, at registration: a read withdrawn later left the trigger
    delivering. The dispatcher asks the owner's grants at every delivery."""
    state = acl_service.state
    reads = f"r-{uuid.uuid4().hex[:8]}"
    await principals.add_role(state, reads, ["read"], [scope], False, [])
    hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    _, root_url = await principal(state, acl_redis, ["admin"])
    mallory, mallory_url = await principal(state, acl_redis, [reads, hooks])
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(root_url, prefix) as as_root, \
            client_of(mallory_url, prefix) as as_mallory:
        for owner, service in ((as_mallory, "mallory-svc"), (as_root, "control-svc")):
            await owner.call("state::register-trigger", {
                "id": f"t-{service}-{scope}", "function_id": f"{service}::on",
                "service": service, "config": {"scope": scope}})
        await as_writer.set(scope, "before", 1)
        assert len(await _delivered(state, "mallory-svc", 1)) == 1  # granted: delivered
        await principals.add_role(state, reads, ["read"], [f"{scope}-other"], False, [])
        await until(lambda: state.access.principal(mallory) is not None and
                    _withdrawn(state, mallory, scope), 30, "the read withdrawn")
        await as_writer.set(scope, "secret", {"pin": 24681357})
        await as_writer.set(scope, "marker", 1)
        # (one partition, in stream order: the control trigger's call for the later write
        # comes after any call of mallory's for the secret)
        await _delivered(state, "control-svc", 3)
        bodies = await _bodies(state, "mallory-svc")
        assert len(bodies) == 1 and not any(b"24681357" in b for b in bodies)


def _withdrawn(state: Any, name: str, scope: str) -> bool:
    try:
        state.access.check(name, "state::get", [scope])
    except PermissionDenied:
        return True
    return False


async def test_principal_remove_keeps_the_principals_private_entries_private(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """`principal remove` released the namespace, "entries kept": what only its accessors
    could read became public. Now its scopes stay claimed (named in the output)."""
    from argparse import Namespace

    from stateworker.app import admin

    state = acl_service.state
    own = await _role(state, ["read", "write", "claims"], ["vault*"])
    _, reader_url = await principal(state, acl_redis, ["reader"])
    alice, alice_url = await principal(state, acl_redis, [own])
    vault = f"vault-{scope}"
    async with client_of(alice_url, prefix) as as_alice:
        await as_alice.call("state::claim-namespace",
                            {"functions_prefix": alice, "scopes": [vault]})
        await as_alice.call(f"{alice}::state::compare-and-set", {
            "scope": vault, "key": "api-key", "expected": None, "value": "sk-live-13572468"})
    removed = await admin.principal_remove(state, Namespace(name=alice, timeout=10.0))
    assert isinstance(removed, dict) and removed["scopes_kept_private"] == [vault]
    async with client_of(reader_url, prefix) as as_reader:
        with pytest.raises(StateError) as private:
            await as_reader.get(vault, "api-key")
        assert private.value.code == "RESERVED_SCOPE"


async def test_list_triggers_shows_a_principal_only_its_own(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A registration shows its match values and barrier id: mallory listed alice's (the
    IBAN her match rule names, on a scope mallory may not read). Now a principal lists its
    own; an admin lists all."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["payroll*"], ["alice-svc"])
    alices_all = await _role(state, ["triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read", "triggers"], ["mallory*"], ["mallory-svc"])
    mallorys_all = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, alice_url = await principal(state, acl_redis, [alices, alices_all])
    _, mallory_url = await principal(state, acl_redis, [mallorys, mallorys_all])
    _, root_url = await principal(state, acl_redis, ["admin"])
    async with client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory, \
            client_of(root_url, prefix) as as_root:
        await as_alice.call("state::register-trigger", {
            "id": f"alice-{scope}", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": f"payroll-{scope}", "match": [
                {"pointer": "/new_value/iban", "equals": "DE89370400440532013000"}]}})
        await as_mallory.call("state::register-trigger", {
            "id": f"mallory-{scope}", "function_id": "mallory-svc::on",
            "service": "mallory-svc", "config": {"scope": f"mallory-{scope}"}})
        mine = await as_mallory.call("state::list-triggers", {})
        assert [t["id"] for t in mine["triggers"]] == [f"mallory-{scope}"]
        assert b"DE89370400440532013000" not in msgspec.json.encode(mine)
        every = await as_root.call("state::list-triggers", {})
        assert {f"alice-{scope}", f"mallory-{scope}"} <= {t["id"] for t in every["triggers"]}


async def test_held_an_ownerless_trigger_is_an_admins_to_change(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A trigger registered with no principal (off mode, in-process) has no owner: a
    principal with the triggers family on `*` may neither replace nor remove it; an admin
    may."""
    from stateworker.context import CallContext
    from stateworker.schemas import RegisterTriggerRequest, TriggerConfig
    from stateworker.state.reactive import triggers

    state = acl_service.state
    await state.execute(triggers.register_plan(state, RegisterTriggerRequest(
        id="legacy", function_id="ops-svc::on", service="ops-svc",
        config=TriggerConfig(scope=scope)), CallContext()))
    hooks = await _role(state, ["read", "triggers"], ["*"], ["*"])
    _, mallory_url = await principal(state, acl_redis, [hooks])
    _, admin_url = await principal(state, acl_redis, ["admin"])
    async with client_of(mallory_url, prefix) as as_mallory, \
            client_of(admin_url, prefix) as as_admin:
        with pytest.raises(PermissionDenied):
            await as_mallory.call("state::register-trigger", {
                "id": "legacy", "function_id": "m::on", "service": "m", "config": {}})
        with pytest.raises(PermissionDenied):
            await as_mallory.call("state::unregister-trigger", {"id": "legacy"})
        done = await as_admin.call("state::unregister-trigger", {"id": "legacy"})
        assert done["removed"] is True


async def test_held_the_longest_principal_and_id_still_call(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """Per-principal ids (`<principal>/<id>`) and writers (`<principal>/<execution_id>`) go
    past the 256 bytes the protocol allows a field: a 64-byte principal's 256-byte id and
    execution id still work, and are still idempotent."""
    state = acl_service.state
    name = "p" + uuid.uuid4().hex + "x" * 31
    assert len(name) == 64
    _, url = await principal(state, acl_redis, ["writer"], name=name)
    async with client_of(url, prefix) as client:
        body = msgspec.json.encode({"scope": scope, "key": "k", "value": 1})
        for _ in range(2):
            await client.call_json("state::set", body, call_id="i" * 256,
                                   context={"execution_id": "e" * 256})
        entry = await client.get_entry(scope, "k")
        assert entry["updated_by"] == f"{name}/{'e' * 256}" and entry["version"] == 1
