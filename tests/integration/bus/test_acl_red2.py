"""Second red-team review of `acl` mode (docs/security.md): each test is a hole found after
bbf2dec; it fails while the hole is open."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from stateworker.bus.protocol import BusOptions
from stateworker.errors import PermissionDenied, StateError
from stateworker.keys import bus_stream
from stateworker.state import principals
from tests.integration.bus.test_acl import client_of, principal
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("acl-red2-redis")))
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def acl_service(acl_redis: RedisServer, prefix: str) -> AsyncIterator[Any]:
    from stateworker.app.service import StateService

    settings = settings_for(acl_redis, prefix, auth="acl")
    async with StateService.running(settings, BusOptions(block_ms=50)) as running:
        yield running


async def _role(state: Any, allow: list[str], scopes: list[str], services: list[str] = (),
                read_only: bool = False) -> str:
    name = f"r-{uuid.uuid4().hex[:8]}"
    await principals.add_role(state, name, allow, scopes, read_only, list(services))
    return name


async def _bodies(state: Any, service: str) -> list[bytes]:
    """The bodies of the handler calls the dispatcher XADDed to `service`'s stream."""
    flat = await state.conn.execute("XRANGE", bus_stream(state.settings.prefix, service),
                                    "-", "+")
    return [dict(zip(fields[::2], fields[1::2], strict=True)).get(b"body", b"")
            for _, fields in flat]


async def test_a_barrier_trigger_cannot_collect_another_scopes_arrivals(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A barrier is global by its `condition_config.id`, whoever's trigger arrives at it.
    alice (read on `payroll*`) gates her trigger on `payroll` with barrier `month-end`, 2
    arrivals; mallory (read on `mallory*` only, triggers, her own service) registers a
    trigger on her own scope with the same barrier id and expect. may_read checks only
    `config.scope` (hers), so it is accepted; her write completes the barrier, and the
    `allow` payload handed to *her* service carries alice's arrival: the payroll event,
    value included."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["payroll*"], ["alice-svc"])
    alices_all = await _role(state, ["triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read", "write"], ["mallory*"])
    mallorys_hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    _, alice_url = await principal(state, acl_redis, [alices, alices_all])
    mallory, mallory_url = await principal(state, acl_redis, [mallorys, mallorys_hooks])
    payroll, own = f"payroll-{scope}", f"mallory-{scope}"
    barrier_id = f"month-end-{scope}"
    gate = {"condition_function_id": "state::barrier",
            "condition_config": {"id": barrier_id, "expect": 2}}
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        with pytest.raises(PermissionDenied):
            await as_mallory.get(payroll, "ceo")
        await as_alice.call("state::register-trigger", {
            "id": "alice-payroll", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": payroll, **gate}})
        await as_mallory.call("state::register-trigger", {
            "id": f"t-{mallory}", "function_id": "mallory-svc::on", "service": "mallory-svc",
            "config": {"scope": own, **gate}})
        await anyio.sleep(0.5)  # (the dispatchers reload the triggers)
        await as_writer.set(payroll, "ceo", {"salary": 987654321})
        await anyio.sleep(1.0)  # (alice's arrival counted: 1/2)
        await as_mallory.set(own, "x", 1)
        # what mallory's service received, or (when the hole is closed) nothing
        try:
            await until(lambda: _bodies(state, "mallory-svc"), 5.0, "mallory's handler call")
        except AssertionError:
            return
        leaked = [b for b in await _bodies(state, "mallory-svc") if b"987654321" in b]
        assert not leaked, (f"mallory (no read on {payroll!r}) received the payroll value "
                            f"through the shared barrier {barrier_id!r}: {leaked[0][:400]!r}")


async def test_a_trigger_stops_delivering_when_its_read_grant_is_withdrawn(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """may_read is asked once, at registration. The operator narrows mallory's role (or
    replaces her roles) so that she may no longer read `scope`: reads are refused at once,
    but her trigger goes on handing every new value of the scope to her service."""
    state = acl_service.state
    reads = f"r-{uuid.uuid4().hex[:8]}"
    await principals.add_role(state, reads, ["read"], [scope], False, [])
    hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    mallory, mallory_url = await principal(state, acl_redis, [reads, hooks])
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_mallory.call("state::register-trigger", {
            "id": f"t-{mallory}", "function_id": "mallory-svc::on", "service": "mallory-svc",
            "config": {"scope": scope}})
        # the operator withdraws the read: the role now names another scope only
        await principals.add_role(state, reads, ["read"], [f"{scope}-other"], False, [])
        await until(lambda: _refused(as_mallory, scope), 5.0, "the read refused")
        await as_writer.set(scope, "secret", {"pin": 24681357})
        await anyio.sleep(2.0)  # (the dispatcher would have handed it on by now)
        leaked = [b for b in await _bodies(state, "mallory-svc") if b"24681357" in b]
        assert not leaked, (f"mallory's read of {scope!r} is withdrawn, yet her trigger "
                            f"delivered a new value to her service: {leaked[0][:300]!r}")


async def _refused(client: Any, scope: str) -> bool:
    try:
        await client.get(scope, "any")
    except PermissionDenied:
        return True
    return False


async def test_principal_remove_does_not_publish_the_principals_private_entries(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """`principal remove` releases the principal's namespace "entries kept": what only its
    accessors could read becomes a public scope, readable by every `reader` (and writable by
    every `writer`), with no trace in the command's output beyond `scopes_released`."""
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
    async with client_of(reader_url, prefix) as as_reader:
        with pytest.raises(StateError):  # private: RESERVED_SCOPE for anyone else
            await as_reader.get(vault, "api-key")
        removed = await admin.principal_remove(state, Namespace(name=alice, timeout=10.0))
        assert isinstance(removed, dict) and removed["removed"]
        try:
            value = await as_reader.get(vault, "api-key")
        except Exception:
            return
        assert value is None, (f"alice's private entry is public once she is removed: a "
                               f"`reader` reads {vault}/api-key = {value!r}")


async def test_list_triggers_shows_another_principals_match_values_and_barrier_ids(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """The triggers family needs a role on `*`, so every principal that may register a
    trigger on its own scope may also list everyone's registrations: the `equals` values of
    alice's match rules on a scope mallory may not read (values of that scope), and the
    barrier ids that let her join alice's barriers (the test above)."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["payroll*"], ["alice-svc"])
    alices_all = await _role(state, ["triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read"], ["mallory*"])
    mallorys_hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, alice_url = await principal(state, acl_redis, [alices, alices_all])
    _, mallory_url = await principal(state, acl_redis, [mallorys, mallorys_hooks])
    payroll = f"payroll-{scope}"
    async with client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_alice.call("state::register-trigger", {
            "id": "alice-watch", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": payroll, "match": [
                {"pointer": "/new_value/iban", "equals": "DE89370400440532013000"}]}})
        with pytest.raises(PermissionDenied):
            await as_mallory.get(payroll, "ceo")
        try:
            listed = await as_mallory.call("state::list-triggers", {})
        except PermissionDenied:
            return
        shown = msgspec.json.encode(listed)
        assert b"DE89370400440532013000" not in shown, \
            f"mallory (no read on {payroll!r}) lists alice's match value: {shown[:400]!r}"


async def test_one_principal_cannot_use_up_everyone_elses_triggers(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_TRIGGERS (10 000) is one count for the whole prefix (trigger.lua: HLEN), with no
    share per owner: a principal allowed to register triggers on its own scope only fills
    it, and no other principal (nor the operator's own services) registers one until an
    admin removes hers. (The cap is lowered here to 5 to keep the test short; the code path
    is the same at 10 000.)"""
    from stateworker.state import triggers

    monkeypatch.setattr(triggers, "MAX_TRIGGERS", 5)
    state = acl_service.state
    mallorys = await _role(state, ["read"], ["mallory*"])
    hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    alices = await _role(state, ["read", "triggers"], ["*"], ["alice-svc"])
    mallory, mallory_url = await principal(state, acl_redis, [mallorys, hooks])
    _, alice_url = await principal(state, acl_redis, [alices])
    async with client_of(mallory_url, prefix) as as_mallory, \
            client_of(alice_url, prefix) as as_alice:
        for i in range(5):
            await as_mallory.call("state::register-trigger", {
                "id": f"t-{mallory}-{i}", "function_id": "mallory-svc::on",
                "service": "mallory-svc", "config": {"scope": f"mallory-{scope}"}})
        try:
            await as_alice.call("state::register-trigger", {
                "id": "alice-hook", "function_id": "alice-svc::on", "service": "alice-svc",
                "config": {"scope": scope}})
        except Exception as exc:
            pytest.fail(f"mallory's triggers on her own scope use up the prefix's cap: alice "
                        f"cannot register one ({exc})")


# ---- held: probes of the fixed areas that found nothing ----------------------------------------
async def test_held_an_ownerless_trigger_is_an_admins_to_change(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A trigger registered with no principal (off mode, in-process) has no owner: a
    principal with the triggers family on `*` may neither replace nor remove it; an admin
    may."""
    from stateworker.context import CallContext
    from stateworker.schemas import RegisterTriggerRequest, TriggerConfig
    from stateworker.state import triggers

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


async def test_a_barrier_call_cannot_read_what_a_triggers_barrier_carried(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """The same shared barrier, with no trigger at all: state::barrier (the `write` family,
    a grant on `*` since it names no scope) completes any barrier by its id and returns the
    payload, every arrival's carried event. mallory, granted only `state::barrier` (say an
    engine's fan-in) and reads on her own scopes, reads the payroll events alice's
    barrier-gated trigger collected."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["payroll*"], ["alice-svc"])
    alices_all = await _role(state, ["triggers"], ["*"], ["alice-svc"])
    fan_in = await _role(state, ["state::barrier"], ["*"])
    mallorys = await _role(state, ["read"], ["mallory*"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    _, alice_url = await principal(state, acl_redis, [alices, alices_all])
    _, mallory_url = await principal(state, acl_redis, [fan_in, mallorys])
    payroll, barrier_id = f"payroll-{scope}", f"month-end-{scope}"
    config = {"id": barrier_id, "expect": 2}
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        with pytest.raises(PermissionDenied):
            await as_mallory.get(payroll, "ceo")
        await as_alice.call("state::register-trigger", {
            "id": "alice-payroll", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": payroll, "condition_function_id": "state::barrier",
                       "condition_config": config}})
        await anyio.sleep(0.5)  # (the dispatchers reload the triggers)
        await as_writer.set(payroll, "ceo", {"salary": 987654321})
        await anyio.sleep(1.0)  # (alice's arrival counted: 1/2)
        try:
            decision = await as_mallory.call("state::barrier", {
                "event": {"key": "mallory"}, "condition_config": config})
        except PermissionDenied:
            return
        shown = msgspec.json.encode(decision)
        assert b"987654321" not in shown, \
            f"mallory (no read on {payroll!r}) read the payroll value off the barrier: {shown[:400]!r}"


async def test_a_write_only_role_does_not_read_values(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A role of the `write` family alone (an ingest principal: it may store into `scope`,
    not read it; `state::get` is refused) reads any value anyway, without changing it:
    compare-and-set with an `expected` that never matches answers `{swapped: false,
    current}`, the stored value. (state::delete and state::update hand back old values too,
    destructively.)"""
    state = acl_service.state
    ingest = await _role(state, ["write"], [scope])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    _, mallory_url = await principal(state, acl_redis, [ingest])
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_writer.set(scope, "card", {"pan": "4111111111111111"})
        with pytest.raises(PermissionDenied):
            await as_mallory.get(scope, "card")
        try:
            swapped = await as_mallory.call("state::compare-and-set", {
                "scope": scope, "key": "card", "expected": {"never": uuid.uuid4().hex},
                "value": 0})
        except PermissionDenied:
            return
        shown = msgspec.json.encode(swapped)
        assert b"4111111111111111" not in shown, \
            f"a write-only principal read the value through compare-and-set: {shown!r}"
