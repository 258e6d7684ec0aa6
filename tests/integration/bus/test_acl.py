"""`acl` mode end to end: principals with Redis ACL users of their own call the state service
over their own streams; Redis refuses them everything else, the service takes their identity
from the stream and checks their roles (docs/security.md)."""

from __future__ import annotations

import uuid
from argparse import Namespace
from typing import Any

import anyio
import msgspec
import pytest
import redis
import redis.asyncio as aredis

from stateworker.errors import PermissionDenied, StateError
from stateworker.keys import bus_stream, principal_reply_prefix, principal_stream
from stateworker.state.tenancy import principals
from tests.integration.acl import client_of, principal, raw_call
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_principal_calls_as_itself_and_is_recorded_as_the_writer(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    name, url = await principal(acl_service.state, acl_redis, ["writer"])
    async with client_of(url, prefix) as client:
        await client.set(scope, "k", 1)
        entry = await client.get_entry(scope, "k")
        assert entry["updated_by"] == name
        await client.call_json("state::set", msgspec.json.encode(
            {"scope": scope, "key": "k", "value": 2}), context={"execution_id": "run-7"})
        assert (await client.get_entry(scope, "k"))["updated_by"] == f"{name}/run-7"


async def test_redis_refuses_a_principal_every_other_stream_and_reply_list(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    alice, alice_url = await principal(acl_service.state, acl_redis, ["writer"])
    bob, _ = await principal(acl_service.state, acl_redis, ["writer"])
    conn = aredis.Redis.from_url(alice_url)
    try:
        fields = {"id": "x", "fn": "state::get", "body": "{}", "reply": ""}
        for stream in (principal_stream(prefix, "state", bob), bus_stream(prefix, "state")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await conn.xadd(stream, fields)
        bobs_replies = principal_reply_prefix(prefix, bob) + "c1"
        for command in (("LPOP", bobs_replies), ("BLMPOP", 1, 1, bobs_replies, "LEFT"),
                        ("DEL", bobs_replies), ("XRANGE", principal_stream(prefix, "state",
                                                                          alice), "-", "+"),
                        ("SCAN", 0), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                await conn.execute_command(*command)
        # and what it may do works: its own stream, its own reply list
        await conn.xadd(principal_stream(prefix, "state", alice), fields)
    finally:
        await conn.aclose()


async def test_a_forged_caller_is_refused_and_writes_nothing(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    alice, url = await principal(acl_service.state, acl_redis, ["writer"])
    bob, _ = await principal(acl_service.state, acl_redis, ["writer"])
    conn = aredis.Redis.from_url(url)
    try:
        stream = principal_stream(prefix, "state", alice)
        reply = principal_reply_prefix(prefix, alice) + "hand"
        body = {"scope": scope, "key": "k", "value": 1}
        document = await raw_call(conn, stream, reply, "state::set", body, caller=bob)
        assert document["error"]["code"] == "PERMISSION_DENIED"
        assert bob in document["error"]["message"] and alice in document["error"]["message"]
        assert await acl_service.state.conn.execute(
            "EXISTS", acl_service.state.keys.for_scope(scope).entry(scope, "k")) == 0
        # its own name as caller is accepted
        document = await raw_call(conn, stream, reply, "state::set", body, caller=alice)
        assert document["ok"], document
    finally:
        await conn.aclose()


async def test_the_shared_stream_is_closed_in_acl_mode(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    admin = aredis.Redis(port=acl_redis.port)  # the default user may write anywhere
    try:
        reply = f"{prefix}:reply:admin-hand"
        document = await raw_call(admin, bus_stream(prefix, "state"), reply, "state::set",
                                  {"scope": scope, "key": "k", "value": 1}, caller="alice")
        assert document["error"]["code"] == "PERMISSION_DENIED"
        assert principal_stream(prefix, "state", "<principal>") in document["error"]["message"]
        assert await admin.exists(acl_service.state.keys.for_scope(scope).entry(scope, "k")) == 0
        assert await admin.xlen(bus_stream(prefix, "state")) == 0  # acknowledged and deleted
    finally:
        await admin.aclose()


async def test_a_reply_list_of_another_principal_is_never_written(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    alice, url = await principal(acl_service.state, acl_redis, ["writer"])
    bob, _ = await principal(acl_service.state, acl_redis, ["writer"])
    conn = aredis.Redis.from_url(url)
    admin = aredis.Redis(port=acl_redis.port)
    try:
        stream = principal_stream(prefix, "state", alice)
        bobs = principal_reply_prefix(prefix, bob) + "c1"
        await conn.xadd(stream, {"id": "r1", "fn": "state::set", "reply": bobs, "body":
                                 msgspec.json.encode({"scope": scope, "key": "k", "value": 1})})
        # then a call of its own, answered: the first was read and acknowledged before it
        mine = principal_reply_prefix(prefix, alice) + "c1"
        document = await raw_call(conn, stream, mine, "state::get", {"scope": scope, "key": "k"})
        assert document == {"id": document["id"], "ok": True, "result": None}
        assert await admin.exists(bobs) == 0
    finally:
        await conn.aclose()
        await admin.aclose()


async def test_roles_decide_functions_and_scopes(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    state = acl_service.state
    role = f"orders-{uuid.uuid4().hex[:6]}"
    await principals.add_role(state, role, ["read", "write"], ["orders*"], False, [])
    clerk, clerk_url = await principal(state, acl_redis, [role])
    reader, reader_url = await principal(state, acl_redis, ["reader"])
    async with client_of(clerk_url, prefix) as clerk_client, \
            client_of(reader_url, prefix) as reader_client:
        await clerk_client.set("orders-1", "o", 1)
        with pytest.raises(PermissionDenied) as denied:
            await clerk_client.set("billing", "b", 1)
        assert denied.value.details["principal"] == clerk
        assert denied.value.details["scope"] == "billing"
        assert denied.value.details["fn"] == "state::set"
        assert "billing" in denied.value.message and clerk in denied.value.message
        assert await reader_client.get("orders-1", "o") == 1
        with pytest.raises(PermissionDenied) as denied:
            await reader_client.set("orders-1", "o", 2)
        assert denied.value.details["principal"] == reader
        with pytest.raises(PermissionDenied):  # no scope named: a role on every scope needed
            await clerk_client.list_groups()
        assert await clerk_client.get("orders-1", "o") == 1


async def test_a_moco_user_is_accepted_only_from_an_engine_principal(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    state = acl_service.state
    alice, alice_url = await principal(state, acl_redis, ["writer"])
    _, engine_url = await principal(state, acl_redis, ["writer"], act_as=("*",))
    body = msgspec.json.encode({"namespace": "tasks", "key": "t1", "value": {"n": 1}})
    async with client_of(alice_url, prefix) as as_alice, \
            client_of(engine_url, prefix) as as_engine:
        with pytest.raises(PermissionDenied) as denied:  # alice cannot act as bob
            await as_alice.call_json("builtin.state.set_state", body,
                                     context={"user_id": "bob"})
        assert denied.value.details["path"] == "context.user_id"
        await as_alice.call_json("builtin.state.set_state", body, context={"user_id": alice})
        await as_engine.call_json("builtin.state.set_state", body, context={"user_id": "bob"})
        got = msgspec.json.decode(await as_engine.call_json(
            "builtin.state.get_state", msgspec.json.encode({"namespace": "tasks", "key": "t1"}),
            context={"user_id": "bob"}))
        assert got == {"n": 1} or got.get("value") == {"n": 1}


async def test_64_principals_at_once_each_get_their_own_replies(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    state = acl_service.state
    made = [await principal(state, acl_redis, ["writer"]) for _ in range(64)]
    seen: dict[str, list[Any]] = {}

    async def calls(name: str, url: str) -> None:
        async with client_of(url, prefix) as client:
            got = []
            for i in range(10):
                await client.set(scope, name, i)
                entry = await client.get_entry(scope, name)
                got.append((entry["value"], entry["updated_by"]))
            seen[name] = got

    async with anyio.create_task_group() as tg:
        for name, url in made:
            tg.start_soon(calls, name, url)
    assert seen == {name: [(i, name) for i in range(10)] for name, _ in made}
    for name, _ in made:  # every call acknowledged and deleted on the stream it came on
        stream = principal_stream(prefix, "state", name)
        assert await state.conn.execute("XLEN", stream) == 0
        assert (await state.conn.execute("XPENDING", stream, "state"))[0] == 0


async def test_adding_and_removing_a_principal_under_load_loses_no_call_of_the_others(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    from stateworker.app import admin

    state = acl_service.state
    writers = [await principal(state, acl_redis, ["writer"]) for _ in range(6)]
    victim = await principal(state, acl_redis, ["writer"])
    acknowledged: dict[str, int] = {}
    failed: dict[str, int] = {}
    started = anyio.Event()
    stop = anyio.Event()
    progress = anyio.Condition()

    async def write(name: str, url: str) -> None:
        acknowledged[name] = failed[name] = 0
        async with client_of(url, prefix, retries=0) as client:
            while not stop.is_set():
                try:
                    await client.set(scope, f"{name}:{acknowledged[name]}", 1)
                except Exception:  # the victim's calls after its user is deleted
                    failed[name] += 1
                    if name != victim[0]:
                        raise
                    return
                acknowledged[name] += 1
                if acknowledged[name] == 5:
                    started.set()
                async with progress:
                    progress.notify_all()

    async with anyio.create_task_group() as tg:
        for name, url in [*writers, victim]:
            tg.start_soon(write, name, url)
        await started.wait()
        late, late_url = await principal(state, acl_redis, ["writer"])  # no restart needed
        async with client_of(late_url, prefix) as client:
            await client.set(scope, "late", 1)
            assert (await client.get_entry(scope, "late"))["updated_by"] == late
        removed = await admin.principal_remove(state, Namespace(name=victim[0], timeout=30.0))
        assert isinstance(removed, dict) and removed["removed"] is True
        for name, _ in writers:  # each goes on after the removal
            target = acknowledged[name] + 5
            with anyio.fail_after(30):
                async with progress:
                    while acknowledged[name] < target:
                        await progress.wait()
        stop.set()
    keys = {k.decode() for k in await state.conn.execute(
        "ZRANGE", state.keys.for_scope(scope).key_index(scope), 0, -1)}
    for name, _ in [*writers, victim]:
        mine = {k for k in keys if k.startswith(f"{name}:")}
        # every acknowledged call is there (and at most the one in flight at the end more)
        assert {f"{name}:{i}" for i in range(acknowledged[name])} <= mine
        assert len(mine) - acknowledged[name] in (0, 1)
    assert failed[victim[0]] == 1  # its user deleted: its next call failed, it stopped
    assert state.access.principal(victim[0]) is None
    assert victim[0] not in state.access.principals()
    assert await state.conn.execute("EXISTS", principal_stream(prefix, "state", victim[0])) == 0


@pytest.mark.parametrize("field", ["user_id", "dag_name", "root_dag_name", "org_id"])
async def test_no_context_field_names_another_user_unless_act_as_allows(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str, field: str) -> None:
    state = acl_service.state
    alice, alice_url = await principal(state, acl_redis, ["writer"])
    _, dagu_url = await principal(state, acl_redis, ["writer"], act_as=("team-*",))
    body = msgspec.json.encode({"scope": scope, "key": "k"})
    async with client_of(alice_url, prefix) as as_alice, client_of(dagu_url, prefix) as engine:
        with pytest.raises(PermissionDenied) as denied:
            await as_alice.call_json("state::get", body, context={field: "bob"})
        assert denied.value.details["path"] == f"context.{field}"
        assert alice in denied.value.message and "bob" in denied.value.message
        await as_alice.call_json("state::get", body, context={field: alice})  # itself
        await engine.call_json("state::get", body, context={field: "team-7"})
        with pytest.raises(PermissionDenied):  # outside its act_as
            await engine.call_json("state::get", body, context={field: "bob"})


async def test_claims_in_acl_mode_cannot_squat_and_serve_only_their_principal(
        acl_service: Any, acl_redis: RedisServer, prefix: str, scope: str) -> None:
    state = acl_service.state
    role = f"claimer-{uuid.uuid4().hex[:6]}"
    await principals.add_role(state, role, ["read", "write", "claims"], ["*"], False, [])
    owner, owner_url = await principal(state, acl_redis, [role])
    mallory, mallory_url = await principal(state, acl_redis, [role])
    root, root_url = await principal(state, acl_redis, ["admin"])
    private = f"{scope}-private"
    async with client_of(owner_url, prefix) as as_owner, \
            client_of(mallory_url, prefix) as as_mallory, client_of(root_url, prefix) as as_root:
        await as_owner.set(scope, "o-1", 1)  # a public scope in use
        with pytest.raises(StateError) as squat:
            await as_mallory.call("state::claim-namespace",
                                  {"functions_prefix": mallory, "scopes": [scope]})
        assert squat.value.code == "SCOPE_IN_USE"
        with pytest.raises(StateError) as other:  # the claimant is the principal
            await as_mallory.call("state::claim-namespace",
                                  {"functions_prefix": owner, "scopes": [private]})
        assert other.value.code == "FORBIDDEN"
        with pytest.raises(PermissionDenied):  # adopting needs an admin
            await as_mallory.call("state::claim-namespace", {
                "functions_prefix": mallory, "scopes": [scope], "adopt": True})
        assert await as_owner.get(scope, "o-1") == 1  # still public
        await as_owner.call("state::claim-namespace",
                            {"functions_prefix": owner, "scopes": [private]})
        await as_owner.call(f"{owner}::state::compare-and-set", {
            "scope": private, "key": "k", "expected": None, "value": 1})
        assert await as_owner.call(f"{owner}::state::get", {"scope": private, "key": "k"}) == 1
        with pytest.raises(PermissionDenied) as denied:  # another principal's accessor
            await as_mallory.call(f"{owner}::state::get", {"scope": private, "key": "k"})
        assert denied.value.details["namespace"] == owner
        assert await as_root.call(f"{owner}::state::get", {"scope": private, "key": "k"}) == 1
        adopted = await as_root.call("state::claim-namespace", {
            "functions_prefix": root, "scopes": [scope], "adopt": True})
        assert adopted["adopted"] == [scope]
        released = await as_root.call("state::release-namespace", {"scopes": [scope]})
        assert released["released"] == [scope]
        assert await as_owner.get(scope, "o-1") == 1  # public again, entries kept


async def test_in_acl_mode_a_trigger_cannot_call_the_state_service_itself(
        acl_service: Any, acl_redis: RedisServer, prefix: str) -> None:
    _, root_url = await principal(acl_service.state, acl_redis, ["admin"])
    async with client_of(root_url, prefix) as as_root:
        with pytest.raises(StateError) as refused:
            await as_root.call("state::register-trigger", {
                "function_id": "state::set", "service": "state", "config": {"scope": "x"}})
        assert refused.value.code == "INVALID_REQUEST"
        assert refused.value.details["path"] == "$.service"
        registered = await as_root.call("state::register-trigger", {
            "function_id": "reactor::on", "service": "reactor", "config": {"scope": "x"}})
        assert registered["id"]
