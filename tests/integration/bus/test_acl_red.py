"""Red-team probes of `acl` mode (docs/security.md): each test is a hole a hostile review
found, closed since; it fails when the hole opens again."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import msgspec
import pytest
import redis
import redis.asyncio as aredis

from stateworker.errors import PermissionDenied, StateError
from stateworker.keys import bus_stream, principal_reply_prefix, principal_stream
from stateworker.state.tenancy import principals
from tests.integration.acl import client_of, principal, raw_call
from tests.integration.acl import role as _role
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def _stream_entries(state: Any, stream: str) -> list[dict[bytes, bytes]]:
    flat = await state.conn.execute("XRANGE", stream, "-", "+")
    return [dict(zip(fields[::2], fields[1::2], strict=True)) for _, fields in flat]


# ---- probes ------------------------------------------------------------------------------------
async def test_moco_list_namespaces_needs_a_role_on_every_scope(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """state::list_groups and state::list-namespaces need a role on `*`; moco's
    builtin.state.list_namespaces is the same read (native list_groups) and must too."""
    state = acl_service.state
    _, writer_url = await principal(state, acl_redis, ["writer"])
    narrow = await _role(state, ["read"], ["nothing-at-all"])
    mallory, mallory_url = await principal(state, acl_redis, [narrow])
    secret = f"{scope}-hidden-customer"
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_writer.set(secret, "k", 1)
        with pytest.raises(PermissionDenied):
            await as_mallory.list_groups()
        body = msgspec.json.encode({"in_global_ns": True})
        with pytest.raises(PermissionDenied):
            listed = await as_mallory.call_json("builtin.state.list_namespaces", body,
                                                context={"user_id": mallory})
            pytest.fail(f"mallory (read on 'nothing-at-all' only) listed every scope: "
                        f"{msgspec.json.decode(listed)}")


async def test_a_principal_cannot_replace_or_remove_another_principals_trigger(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """Trigger ids are chosen by the caller and carry no owner: mallory re-registers alice's
    id with her own service (hijacking its events) or unregisters it."""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read", "triggers"], ["*"], ["mallory-svc"])
    _, alice_url = await principal(state, acl_redis, [alices])
    _, mallory_url = await principal(state, acl_redis, [mallorys])
    async with client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_alice.call("state::register-trigger", {
            "id": "billing-hook", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": scope}})
        replaced = unregistered = None
        try:
            await as_mallory.call("state::register-trigger", {
                "id": "billing-hook", "function_id": "mallory-svc::on",
                "service": "mallory-svc", "config": {"scope": scope}})
        except StateError as exc:
            replaced = exc
        listed = await as_alice.call("state::list-triggers", {})
        after_register = [t for t in listed["triggers"] if t["id"] == "billing-hook"]
        try:
            await as_mallory.call("state::unregister-trigger", {"id": "billing-hook"})
        except StateError as exc:
            unregistered = exc
        listed = await as_alice.call("state::list-triggers", {})
        after_unregister = [t for t in listed["triggers"] if t["id"] == "billing-hook"]
        assert after_register and after_register[0]["service"] == "alice-svc", \
            f"mallory replaced alice's trigger ({replaced!r}): {after_register}"
        assert after_unregister, f"mallory unregistered alice's trigger ({unregistered!r})"


async def test_a_trigger_delivers_only_scopes_its_registrant_may_read(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """mallory may read only `mallory/*`, and register triggers (a role on `*`, which the
    triggers family needs) to her own service: a trigger on a scope she may not read hands
    her its values."""
    state = acl_service.state
    reads = await _role(state, ["read"], ["mallory/*"])
    hooks = await _role(state, ["triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    mallory, mallory_url = await principal(state, acl_redis, [reads, hooks])
    payroll = f"{scope}-payroll"
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(mallory_url, prefix) as as_mallory:
        with pytest.raises(PermissionDenied):
            await as_mallory.get(payroll, "ceo")
        with pytest.raises(PermissionDenied) as refused:
            await as_mallory.call("state::register-trigger", {
                "id": f"t-{mallory}", "function_id": "mallory-svc::on",
                "service": "mallory-svc", "config": {"scope": payroll}})
        assert refused.value.details["path"] == "$.config.scope"
        with pytest.raises(PermissionDenied):  # no scope: every scope's values
            await as_mallory.call("state::register-trigger", {
                "id": f"t-{mallory}-all", "function_id": "mallory-svc::on",
                "service": "mallory-svc", "config": {}})
        await as_mallory.call("state::register-trigger", {  # her own scopes: fine
            "id": f"t-{mallory}-own", "function_id": "mallory-svc::on",
            "service": "mallory-svc", "config": {"scope": "mallory/a"}})
        listed = await as_mallory.call("state::list-triggers", {})  # (her own)
        assert [t["id"] for t in listed["triggers"]] == [f"t-{mallory}-own"]
        await as_writer.set(payroll, "ceo", {"salary": 1_000_000})


async def test_a_removed_principals_trigger_stops(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """`principal remove` leaves what the principal registered: its triggers go on calling
    the service it named."""
    from stateworker.app import admin

    state = acl_service.state
    hooks = await _role(state, ["read", "triggers", "claims"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    mallory, mallory_url = await principal(state, acl_redis, [hooks])
    async with client_of(mallory_url, prefix) as as_mallory:
        await as_mallory.call("state::register-trigger", {
            "id": f"t-{mallory}", "function_id": "mallory-svc::on", "service": "mallory-svc",
            "config": {"scope": scope}})
        await as_mallory.call("state::claim-namespace",
                              {"functions_prefix": mallory, "scopes": [f"{scope}-mine"]})
    removed = await admin.principal_remove(state, Namespace(name=mallory, timeout=10.0))
    assert isinstance(removed, dict) and removed["removed"]
    assert removed["triggers_unregistered"] == [f"t-{mallory}"]
    assert removed["scopes_kept_private"] == [f"{scope}-mine"]  # (its entries stay private)
    triggers = await principals.stored(state)  # (the operator's view: every trigger)
    assert mallory not in triggers[0]
    listed = await state.conn.execute("HKEYS", state.keys.triggers)
    assert f"t-{mallory}".encode() not in listed
    async with client_of(writer_url, prefix) as as_writer:
        with pytest.raises(StateError) as private:
            await as_writer.set(f"{scope}-mine", "k", 1)
        assert private.value.code == "RESERVED_SCOPE"


async def test_principal_remove_is_not_wedged_by_a_stream_the_principal_made(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    """A stream no service reads (no group) with one entry was never "drained", so `principal
    remove` could never finish; and its ACL user could make any number of them."""
    from stateworker.app import admin

    state = acl_service.state
    mallory, url = await principal(state, acl_redis, ["writer"])
    conn = aredis.Redis.from_url(url)
    try:  # its user may make no stream but its own to the state service ...
        with pytest.raises(redis.exceptions.NoPermissionError):
            await conn.xadd(principal_stream(prefix, "nobody-reads-this", mallory), {"x": "1"})
    finally:
        await conn.aclose()
    # ... and one nobody reads (left from before, made by the operator) holds up nothing
    await state.conn.execute("XADD", principal_stream(prefix, "nobody-reads-this", mallory),
                             "*", "x", "1")
    removed = await admin.principal_remove(state, Namespace(name=mallory, timeout=3.0))
    assert isinstance(removed, dict) and removed["removed"], \
        f"principal remove did not finish: {removed!r}; record still there: " \
        f"{state.access.principal(mallory)}"


async def test_a_trigger_cannot_send_calls_into_a_principals_stream(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """Only `service: "state"` is refused as a target; `state:from:<principal>` is a valid bus
    name, so the dispatcher XADDs the trigger's calls into that principal's own stream, which
    the state service serves as that principal's calls. They are refused today only because
    the dispatcher's entry carries `caller: state` -- so for a principal named `state` they
    run: mallory, with no write grant at all, deletes every key written to `scope`."""
    state = acl_service.state
    hooks = await _role(state, ["triggers"], ["*"], ["*"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    await principal(state, acl_redis, ["writer"], name="state")
    _, mallory_url = await principal(state, acl_redis, [hooks])
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(mallory_url, prefix) as as_mallory:
        with pytest.raises(StateError) as refused:
            await as_mallory.call("state::register-trigger", {
                "id": "t-inject", "function_id": "state::delete", "service": "state:from:state",
                "config": {"scope": scope}})
        assert refused.value.code == "INVALID_REQUEST"
        assert refused.value.details["path"] == "$.service" and ":from:" in refused.value.message
        await as_writer.set(scope, "k", 1)


async def test_an_accessor_needs_the_family_of_the_function_it_serves(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """docs/security.md: an accessor is in the families of the native function it serves. A
    principal with `reader` and `claims` (no write anywhere) writes through its own
    `<name>::state::compare-and-set`: the owner's accessor calls skip every grant check."""
    state = acl_service.state
    claims = await _role(state, ["claims"], ["*"])
    mallory, url = await principal(state, acl_redis, ["reader", claims])
    async with client_of(url, prefix) as as_mallory:
        await as_mallory.call("state::claim-namespace",
                              {"functions_prefix": mallory, "scopes": [scope]})
        with pytest.raises(PermissionDenied):
            await as_mallory.call(f"{mallory}::state::compare-and-set", {
                "scope": scope, "key": "k", "expected": None, "value": 1})


async def test_claims_can_be_granted_on_a_scope_pattern(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    """docs/security.md: "a claim of several scopes needs each" scope granted. Today a claim
    needs `claims` on `*`, so the only claimant there is may squat every scope not yet used
    (another tenant's future `wf/<org>/<workflow>`, a moco user's `<user>:<ns>` ...), whose
    owners' calls then fail with RESERVED_SCOPE."""
    state = acl_service.state
    own = await _role(state, ["read", "write", "claims"], ["mine/*"])
    mallory, url = await principal(state, acl_redis, [own])
    async with client_of(url, prefix) as as_mallory:
        claimed = await as_mallory.call("state::claim-namespace",
                                        {"functions_prefix": mallory, "scopes": ["mine/x"]})
        assert claimed["scopes"] == ["mine/x"]
        with pytest.raises(PermissionDenied):
            await as_mallory.call("state::claim-namespace",
                                  {"functions_prefix": mallory, "scopes": ["wf/alice/w1"]})


async def test_an_engine_principal_cannot_record_a_write_as_another_principal(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """An engine principal (act_as `tenant-*`) keeps its context's execution id as the
    writer recorded, whatever it is: `execution_id: "alice"` records the write as alice's
    (a principal it may not act as), with no trace of the engine."""
    state = acl_service.state
    alice, _ = await principal(state, acl_redis, ["writer"])
    engine, url = await principal(state, acl_redis, ["writer"], act_as=("tenant-*",))
    async with client_of(url, prefix) as as_engine:
        await as_engine.call_json("state::set", msgspec.json.encode(
            {"scope": scope, "key": "k", "value": 1}), context={"execution_id": alice})
        recorded = (await as_engine.get_entry(scope, "k"))["updated_by"]
        assert recorded != alice, f"the engine {engine!r} recorded its write as {recorded!r}"


@pytest.mark.parametrize("malformed", [
    {"caller": "someone-else"},  # a forged caller: refused while the entry is parsed
    {"fn": None},  # no `fn` field
    {"context": "not json"},
    {"deadline_ms": "soon"},
])
async def test_a_malformed_call_is_never_answered_on_another_principals_list(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str,
        malformed: dict[str, Any]) -> None:
    """A well-formed call naming bob's reply list is acknowledged and not answered; one that
    fails to parse is answered with its error on whatever list it names, so mallory makes the
    service LPUSH (and PEXPIRE) documents of her choosing (id, part of the message) into
    bob's reply lists: a forged error reply to a call of bob's, or lists made under bob's
    name."""
    state = acl_service.state
    mallory, url = await principal(state, acl_redis, ["writer"])
    bob, _ = await principal(state, acl_redis, ["writer"])
    conn = aredis.Redis.from_url(url)
    admin = aredis.Redis(port=acl_redis.port)
    try:
        bobs = principal_reply_prefix(prefix, bob) + "c1"
        fields: dict[str, Any] = {"id": "bobs-call-id", "fn": "state::get",
                                  "body": msgspec.json.encode({"scope": scope, "key": "k"}),
                                  "reply": bobs}
        for name, value in malformed.items():
            if value is None:
                fields.pop(name)
            else:
                fields[name] = value
        await conn.xadd(principal_stream(prefix, "state", mallory), fields)
        mine = principal_reply_prefix(prefix, mallory) + "c1"
        document = await raw_call(conn, principal_stream(prefix, "state", mallory), mine,
                                  "state::get", {"scope": scope, "key": "k"})
        assert document["ok"], document
        written = await admin.lrange(bobs, 0, -1)
        assert written == [], f"the service wrote to bob's reply list {bobs}: {written}"
    finally:
        await conn.aclose()
        await admin.aclose()


async def test_a_principals_condition_trigger_does_not_stop_everyone_elses_triggers(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """In acl mode the dispatcher's client for a bus condition (`condition_function_id` other
    than state::barrier) is a `StateClient` on the service's own settings: `caller_route`
    raises ConfigError (the service's URL names no principal), the partition's batch fails
    and is retried forever. One principal with `triggers` (and a service of its own) registers
    a condition trigger on no scope, and no trigger of anyone fires again. (Where the URL names
    the service's user, the condition was asked on a principal stream of that name instead,
    which no worker serving the condition reads: it is asked on the service's own stream.)"""
    state = acl_service.state
    alices = await _role(state, ["read", "triggers"], ["*"], ["alice-svc"])
    mallorys = await _role(state, ["read", "triggers"], ["*"], ["mallory-svc"])
    _, writer_url = await principal(state, acl_redis, ["writer"])
    _, alice_url = await principal(state, acl_redis, [alices])
    _, mallory_url = await principal(state, acl_redis, [mallorys])
    async with client_of(writer_url, prefix) as as_writer, \
            client_of(alice_url, prefix) as as_alice, \
            client_of(mallory_url, prefix) as as_mallory:
        await as_alice.call("state::register-trigger", {
            "id": "alice-hook", "function_id": "alice-svc::on", "service": "alice-svc",
            "config": {"scope": scope}})
        await as_mallory.call("state::register-trigger", {
            "id": "mallory-cond", "function_id": "mallory-svc::on", "service": "mallory-svc",
            # (nobody serves it: a condition given 1 ms is skipped then, not after 5 s)
            "config": {"condition_function_id": "mallory-svc::cond",
                       "condition_timeout_ms": 1}})
        for i in range(3):
            await as_writer.set(scope, f"k{i}", i)

        async def delivered() -> bool:
            return len(await _stream_entries(state, bus_stream(prefix, "alice-svc"))) >= 3

        await until(delivered, 30, "alice's trigger to deliver 3 events")

        async def asked() -> bool:  # (where mallory's worker for the condition reads)
            entries = await _stream_entries(state, bus_stream(prefix, "mallory-svc"))
            return sum(e[b"fn"] == b"mallory-svc::cond" for e in entries) >= 3

        await until(asked, 30, "mallory's condition asked on its service's stream")


async def test_call_ids_are_per_principal(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    """A call id is bound (bind.lua) to the call's digest, fn + body, across all callers: a
    call of mallory's with the id bob's call will use (an idempotency key such as
    `order-123`) makes bob's call CALL_ID_REUSED for the dedupe window (900 s), and bob's
    call identical to one of mallory's is answered with mallory's recorded reply, not run."""
    state = acl_service.state
    mallory, mallory_url = await principal(state, acl_redis, ["writer"])
    bob, bob_url = await principal(state, acl_redis, ["writer"])
    as_mallory, as_bob = aredis.Redis.from_url(mallory_url), aredis.Redis.from_url(bob_url)
    try:
        squat = await raw_call(as_mallory, principal_stream(prefix, "state", mallory),
                               principal_reply_prefix(prefix, mallory) + "l", "state::get",
                               {"scope": f"{scope}-m", "key": "x"})
        assert squat["ok"]
        # (raw_call makes its own id: XADD by hand with bob's id)
        reply = principal_reply_prefix(prefix, bob) + "l"
        for call_id, body in ((squat["id"], {"scope": scope, "key": "o", "value": 1}),):
            await as_bob.xadd(principal_stream(prefix, "state", bob), {
                "id": call_id, "fn": "state::set", "body": msgspec.json.encode(body),
                "reply": reply})
            document = msgspec.json.decode(
                (await as_bob.execute_command("BLMPOP", 10, 1, reply, "LEFT"))[1][0])
            assert document["ok"], f"bob's call with the id mallory used first: {document}"
    finally:
        await as_mallory.aclose()
        await as_bob.aclose()
