"""The access cache on every replica: a principal or role stored by one follows on another
within a moment through the registry stream; applying the entries again changes nothing; a
reload reads what the hashes hold; access.lua writes a change and its entry together."""

from __future__ import annotations

import uuid

import pytest

from stateworker.errors import Conflict, NotFound, PermissionDenied
from stateworker.state import lifecycle
from stateworker.state.core.access import Access
from stateworker.state.core.registry import RegistryEntry
from stateworker.state.tenancy import principals
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def snapshot(access: Access) -> tuple[object, ...]:
    return (access.principals(), {n: access.principal(n) for n in access.principals()},
            access.roles())


async def test_a_second_replica_follows_principals_and_roles(redis_server: RedisServer,
                                                             prefix: str) -> None:
    settings = settings_for(redis_server, prefix)
    who = f"p{uuid.uuid4().hex[:8]}"
    async with lifecycle.open_state(settings=settings, reaper=False) as one, \
            lifecycle.open_state(settings=settings, reaper=False) as two:
        await principals.add_role(one, "orders", ["read", "write"], ["orders/*"], False, [])
        await principals.add_principal(one, who, ["orders"], ["tenant-*"])
        assert who in one.access.principals()  # the replica that served it: at once
        await until(lambda: who in two.access.principals(), 5, "the principal on replica two")
        two.access.check(who, "state::set", ["orders/1"])
        two.access.check_context(who, {"user_id": "tenant-9"})
        with pytest.raises(PermissionDenied):
            two.access.check(who, "state::set", ["stock"])

        await principals.add_role(one, "orders", ["read"], ["orders/*", "stock"], True, [])
        await until(lambda: two.access.roles()["orders"].read_only, 5, "the new role on two")
        two.access.check(who, "state::get", ["stock"])
        with pytest.raises(PermissionDenied):
            two.access.check(who, "state::set", ["orders/1"])

        await principals.remove_principal(one, who)
        await until(lambda: who not in two.access.principals(), 5, "the removal on two")
        with pytest.raises(PermissionDenied):
            two.access.check(who, "state::get", ["stock"])
        await principals.remove_role(one, "orders")
        await until(lambda: "orders" not in two.access.roles(), 5, "the role's removal")


async def test_applying_the_entries_again_changes_nothing_and_equals_a_reload(
        redis_server: RedisServer, prefix: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with lifecycle.open_state(settings=settings, reaper=False) as state:
        await principals.add_role(state, "r1", ["read"], ["a/*"], False, [])
        await principals.add_principal(state, f"a{prefix}", ["r1"], [])
        await principals.add_principal(state, f"b{prefix}", ["reader"], ["x*"])
        await principals.remove_principal(state, f"a{prefix}")
        await principals.add_role(state, "r2", ["write"], ["*"], False, ["svc"])
        await principals.remove_role(state, "r1")
        held = snapshot(state.access)
        replica = Access(state.conn, state.keys)
        entries = await state.conn.execute("XRANGE", state.keys.registry, "-", "+")
        for _ in range(2):  # every entry twice over, as a reload racing the follower does
            for entry_id, flat in entries:
                fields = {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2],
                                                                 strict=True)}
                await replica.apply(RegistryEntry(entry_id.decode(), fields["kind"], fields))
        assert snapshot(replica) == held
        reloaded = Access(state.conn, state.keys)
        await reloaded.reload()
        assert snapshot(reloaded) == held
        assert {e[1][1] for e in entries} == {b"principals", b"roles"}


async def test_a_refused_change_writes_nothing(redis_server: RedisServer, prefix: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with lifecycle.open_state(settings=settings, reaper=False) as state:
        await principals.add_principal(state, f"a{prefix}", ["reader"], [])
        before = await state.conn.execute("XLEN", state.keys.registry)
        with pytest.raises(Conflict, match="exists"):
            await principals.add_principal(state, f"a{prefix}", ["writer"], [])
        with pytest.raises(NotFound, match="does not exist"):
            await principals.add_principal(state, f"b{prefix}", ["nope"], [])
        assert await state.conn.execute("XLEN", state.keys.registry) == before
        assert await state.conn.execute("HKEYS", state.keys.principals) == [
            f"a{prefix}".encode()]


async def test_a_record_written_by_hand_that_does_not_decode_is_left_out(
        redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = settings_for(redis_server, prefix)
    async with lifecycle.open_state(settings=settings, reaper=False) as state:
        await principals.add_principal(state, "good", ["reader"], [])
        await state.conn.execute("HSET", state.keys.principals, "bad", "{not json")
        await state.conn.execute("HSET", state.keys.roles, "broken", '{"allow": 5}')
    with caplog.at_level("WARNING", logger="stateworker.state.core.access"):
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            assert state.access.principals() == frozenset({"good"})
            assert "broken" not in state.access.roles()
            with pytest.raises(PermissionDenied):
                state.access.check("bad", "state::get", ["x"])
    logged = {r.getMessage().split(" is not valid")[0] for r in caplog.records
              if "left out" in r.getMessage()}
    assert logged == {'principals record "bad"', 'roles record "broken"'}
