"""Private namespaces across replicas and over the bus: a claim served by one state service is
refused by another within a second, claims over the bus take the entry's `caller`, concurrent
claimants leave one owner, and the registry follower reloads after a reconnect."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis

from stateworker import StateError, StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.state.core.registry import RegistryEntry
from tests.calls import refuses
from tests.integration.busproto import roundtrip, until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def replicas(server: RedisServer, prefix: str, count: int, **extra: Any
                   ) -> AsyncIterator[list[StateService]]:
    """`count` state services on the same Redis and prefix (one consumer group); `extra`:
    settings of theirs."""
    async with anyio.create_task_group() as tg:
        services: list[StateService] = []
        stops: list[anyio.Event] = []

        async def run(name: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
            options = BusOptions(block_ms=50, consumer=name)
            async with StateService.running(settings_for(server, prefix, **extra),
                                            options) as service:
                services.append(service)
                stops.append(stop := anyio.Event())
                task_status.started()
                await stop.wait()

        for i in range(count):
            await tg.start(run, f"replica-{i}")
        try:
            yield services
        finally:
            for stop in stops:
                stop.set()


async def test_a_second_replica_refuses_a_claimed_scope_within_a_second(
        redis_server: RedisServer, prefix: str, scope: str,
        caplog: pytest.LogCaptureFixture) -> None:
    scope += '-é/"\\'  # the registry entry carries it as JSON text
    async with replicas(redis_server, prefix, 2) as (first, second):
        one, two = StateStore(first.state), StateStore(second.state)
        await two.set(scope, "k", 1)
        assert await two.list_groups() == [scope]
        claimed_at = time.monotonic()
        await one.call("state::claim-namespace", {"functions_prefix": "billing",
                                                  "scopes": [scope], "adopt": True},
                       caller="billing")
        assert await refuses(one, scope)  # the replica that served it: at once
        await until(lambda: refuses(two, scope), 1.0, "the second replica to refuse the scope")
        assert time.monotonic() - claimed_at < 1.0
        assert await two.list_groups() == []
        assert await two.call("billing::state::get", {"scope": scope, "key": "k"}) == 1
        # learnt from the registry entry itself, not from a reload after failing to apply it
        assert not [r for r in caplog.records if getattr(r, "event", "") == "registry.apply_failed"]
        with pytest.raises(StateError) as refused:
            await two.set(scope, "k", 2)
        assert refused.value.code == "RESERVED_SCOPE"


async def test_a_release_reaches_a_second_replica_within_a_second(
        redis_server: RedisServer, prefix: str, scope: str,
        caplog: pytest.LogCaptureFixture) -> None:
    scope += '-é/"\\'  # the registry entry carries it as a JSON object's key
    settings = settings_for(redis_server, prefix)
    async with replicas(redis_server, prefix, 2) as (first, second), \
            StateClient(settings=settings, caller="billing") as billing, \
            StateClient(settings=settings, caller="mallory") as mallory:
        one, two = StateStore(first.state), StateStore(second.state)
        await billing.claim_namespace("billing", [scope, scope + "-kept"])
        await billing.call("billing::state::compare-and-set",
                           {"scope": scope, "key": "k", "value": 1})
        await until(lambda: refuses(two, scope), 1.0, "the second replica to learn the claim")
        assert await refuses(one, scope)
        with pytest.raises(StateError) as forbidden:
            await mallory.release_namespace([scope])
        assert forbidden.value.code == "FORBIDDEN"
        assert forbidden.value.details["owner"] == "billing"
        assert forbidden.value.details["caller"] == "mallory"
        assert await refuses(one, scope) and await refuses(two, scope)
        done = await billing.release_namespace([scope])
        assert done == {"released": [scope], "scopes": [scope + "-kept"]}

        async def public_on_both() -> bool:
            return not await refuses(one, scope) and not await refuses(two, scope)

        await until(public_on_both, 1.0, "both replicas to serve the released scope")
        for store in (one, two):
            assert await store.get(scope, "k") == 1  # the entry kept
            assert await store.list_groups() == [scope]
            assert await refuses(store, scope + "-kept")
        assert await mallory.get(scope, "k") == 1  # over the bus, any replica
        assert not [r for r in caplog.records if getattr(r, "event", "") == "registry.apply_failed"]


async def test_a_claim_over_the_bus_is_made_as_the_entrys_caller(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings, caller="billing") as billing, \
            StateClient(settings=settings, caller="orders") as orders, \
            StateClient(settings=settings) as nobody:
        with pytest.raises(StateError) as unknown:
            await nobody.claim_namespace("billing", [scope])
        assert unknown.value.code == "UNKNOWN_CALLER"
        with pytest.raises(StateError) as forbidden:
            await orders.claim_namespace("billing", [scope])
        assert forbidden.value.code == "FORBIDDEN"
        assert await orders.get(scope, "k") is None  # still public
        result = await billing.claim_namespace("billing", [scope])
        assert result == {"claimed": True, "scopes": [scope], "functions": [
            "billing::state::get", "billing::state::list", "billing::state::list_keys",
            "billing::state::compare-and-set", "billing::state::list_entries"]}
        # any caller may use the accessors; the public functions refuse the scope
        swap = await orders.call("billing::state::compare-and-set",
                                 {"scope": scope, "key": "k", "value": 5})
        assert swap == {"swapped": True}
        assert await nobody.call("billing::state::list", {"scope": scope}) == [5]
        with pytest.raises(StateError) as reserved:
            await billing.get(scope, "k")
        assert reserved.value.code == "RESERVED_SCOPE"


async def test_the_squatting_sequence_over_the_bus_is_scope_in_use(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    async with StateClient(settings=settings) as anyone, \
            StateClient(settings=settings, caller="mallory") as mallory:
        await anyone.call("state::set", {"scope": scope, "key": "o-1", "value": 1})
        with pytest.raises(StateError) as squat:
            await mallory.call("state::claim-namespace",
                               {"functions_prefix": "mallory", "scopes": [scope]})
        assert squat.value.code == "SCOPE_IN_USE"
        assert squat.value.details["scope"] == scope and squat.value.details["entries"] == 1
        assert await anyone.call("state::get", {"scope": scope, "key": "o-1"}) == 1
        assert scope in (await anyone.call("state::list_groups", {}))["groups"]
        adopted = await mallory.claim_namespace("mallory", [scope], adopt=True)  # off: trusted
        assert adopted["adopted"] == [scope]
        with pytest.raises(StateError) as hidden:
            await anyone.get(scope, "o-1")
        assert hidden.value.code == "RESERVED_SCOPE"
        assert await mallory.release_namespace([scope]) == {"released": [scope], "scopes": []}
        assert await anyone.get(scope, "o-1") == 1


async def test_the_bus_entrys_caller_field_is_the_claimant(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    body = {"functions_prefix": "billing", "scopes": [scope]}
    refused = await roundtrip(raw, prefix, "state::claim-namespace", body)
    assert refused["error"]["code"] == "UNKNOWN_CALLER"
    done = await roundtrip(raw, prefix, "state::claim-namespace", body, caller="billing")
    assert done["result"]["claimed"] is True


async def test_concurrent_claimants_on_two_replicas_leave_one_owner(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = settings_for(redis_server, prefix)
    outcomes: dict[str, Any] = {}

    async def claim(worker: str) -> None:
        async with StateClient(settings=settings, caller=worker) as client:
            try:
                outcomes[worker] = await client.claim_namespace(worker, [scope + "-" + worker,
                                                                         scope])
            except StateError as exc:
                outcomes[worker] = exc

    async with replicas(redis_server, prefix, 2) as (first, _):
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(claim, f"w{i}")
        winners = [w for w, got in outcomes.items() if not isinstance(got, StateError)]
        assert len(winners) == 1, outcomes
        for worker, got in outcomes.items():
            if worker != winners[0]:
                assert isinstance(got, StateError) and got.code == "SCOPE_CONFLICT"
                assert got.details["owner"] == winners[0]
                assert not await refuses(StateStore(first.state), scope + "-" + worker)


async def test_a_replica_reloads_the_claims_after_its_registry_connection_breaks(
        own_redis: RedisServer, scope: str) -> None:
    # No dispatcher: its reads are XREADs too, and the registry follower's is the one cut.
    async with replicas(own_redis, "sw", 1, dispatch=False) as (only,):
        store = StateStore(only.state)
        raw = aredis.Redis(port=own_redis.port)
        try:
            # A claim whose registry entry this replica never sees (as one made while it
            # was cut off and trimmed since): only a reload finds it.
            await raw.hset(only.state.keys.claims, scope, "billing")

            async def reading() -> list[dict[str, Any]]:
                return [c for c in await raw.client_list() if c["cmd"] == "xread"]
            await until(reading, 5.0, "the registry follower's XREAD")
            follower = await reading()
            assert len(follower) == 1
            assert not await refuses(store, scope)
            await raw.client_kill_filter(_id=follower[0]["id"])
            await until(lambda: refuses(store, scope), 5.0, "the reload after the reconnect")
        finally:
            await raw.aclose()


async def test_a_replica_held_up_while_the_registry_is_trimmed_past_it_still_refuses_a_claim(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """A replica whose follower is held up (one entry slow to apply, a stalled process) while
    more than MAXLEN registry entries come in (a leased trigger kept again and again: anyone
    with the `triggers` family) never reads the claim the trim took meanwhile; followed on
    from there it would serve the claimed scope to everyone for good. It reloads instead."""
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as writer, \
            StateStore.open(redis_server.url, prefix=prefix, partitions=4) as replica:
        held, release = anyio.Event(), anyio.Event()

        async def reload() -> None:
            pass

        async def apply(entry: RegistryEntry) -> None:
            held.set()
            await release.wait()

        replica.state.registry.on("held-up", reload, apply)
        conn, stream = writer.state.conn, writer.state.keys.registry
        await writer.register_trigger("audit::seen", "audit", id="kept", ttl_ms=600_000,
                                      config={"scope": f"{scope}-audited"})
        await conn.execute("XADD", stream, "*", "kind", "held-up")
        with anyio.fail_after(10):
            await held.wait()
        await writer.claim_namespace("billing", [scope])
        ((claim_id, _),) = await conn.execute("XREVRANGE", stream, "+", "-", "COUNT", 1)
        kept = 0
        while await conn.execute("XRANGE", stream, claim_id, claim_id):  # until trimmed
            await writer.keep_trigger("kept", ttl_ms=600_000)
            kept += 1
            assert kept <= 5000, "the registry stream was never trimmed"
        release.set()
        await writer.claim_namespace("billing", [f"{scope}-later"])  # (its entry is kept)
        await until(lambda: refuses(replica, f"{scope}-later"), 5.0, "the later claim")
        assert await refuses(replica, scope)
        assert await refuses(writer, scope)


async def test_the_registry_hands_each_entry_to_the_kind_registered_for_it(
        store: StateStore) -> None:
    registry = store.state.registry
    applied: list[RegistryEntry] = []
    reloads: list[str] = []

    async def reload() -> None:
        reloads.append("reload")

    async def apply(entry: RegistryEntry) -> None:
        if entry.fields.get("bad"):
            raise ValueError("a malformed entry")
        applied.append(entry)

    registry.on("test", reload, apply)
    await registry.reload("test")
    assert reloads == ["reload"]
    conn, stream = store.state.conn, store.state.keys.registry
    await conn.execute("XADD", stream, "*", "kind", "other", "x", "1")  # nobody follows it
    await conn.execute("XADD", stream, "*", "kind", "test", "bad", "1")  # apply fails: reload
    entry_id = (await conn.execute("XADD", stream, "*", "kind", "test", "name", "é")).decode()

    async def delivered() -> bool:
        return bool(applied)

    await until(delivered, 1.0, "the entry to be applied")
    assert applied == [RegistryEntry(entry_id, "test", {"kind": "test", "name": "é"})]
    assert reloads == ["reload", "reload"]
    assert registry.last_id == entry_id


async def test_a_claim_or_release_names_at_most_1000_scopes(redis_server: RedisServer,
                                                            prefix: str, scope: str) -> None:
    """1001 scopes in one call: INVALID_REQUEST naming the field, the count and the limit,
    nothing claimed and no registry entry for the replicas; 1000 pass, and are released in
    one call."""
    settings = settings_for(redis_server, prefix)
    async with replicas(redis_server, prefix, 1) as (service,), \
            StateClient(settings=settings, caller="billing") as billing:
        registry = service.state.keys.registry
        before = await service.state.conn.execute("XLEN", registry)
        names = [f"{scope}-{i}" for i in range(1001)]
        for call in (lambda: billing.claim_namespace("billing", names),
                     lambda: billing.release_namespace(names)):
            with pytest.raises(StateError) as refused:
                await call()
            assert refused.value.code == "INVALID_REQUEST"
            assert str(refused.value) == "$.scopes: at most 1000 scopes a call, got 1001"
            assert refused.value.details == {"path": "$.scopes", "size": 1001, "limit": 1000}
        assert await service.state.conn.execute("XLEN", registry) == before
        assert not await refuses(StateStore(service.state), names[0])
        claimed = await billing.claim_namespace("billing", names[:1000])
        assert len(claimed["scopes"]) == 1000
        assert await refuses(StateStore(service.state), names[999])
        assert (await billing.release_namespace(names[:1000]))["scopes"] == []
