"""The Lua library: every script call stays on one cluster slot; the library survives
FUNCTION FLUSH (also while calls flow on the bus) and a restart, and one Redis refuses to
load fails the call, not the store."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from pathlib import Path

import anyio
import msgspec
import pytest
import redis.asyncio as aredis
from redis.crc import key_slot

from stateworker import StateClient, StateError, StateStore
from stateworker.app.service import StateCalls, StateService
from stateworker.bus.protocol import BusOptions
from stateworker.bus.sources import Sources, swept_consumers
from stateworker.context import CallContext
from stateworker.keys import call_field
from stateworker.reactive import trimming
from stateworker.reactive.leases import Leases
from stateworker.reactive.targets import Targets
from stateworker.scripts.bindings import BINDINGS, GET
from stateworker.scripts.library import Library, read_header
from stateworker.scripts.upkeep_bindings import (
    ASIDE,
    SESSION,
    SNAPPAGE,
    SNAPROWS,
    aside_call,
    bus_library,
    session_call,
    snappage_call,
    snaprows_call,
)
from stateworker.snapshot import barriers, behind
from stateworker.state import functions, generation
from stateworker.state.kv import repack
from stateworker.state.reactive import trigger_leases
from stateworker.state.tenancy import principals
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import Arg
from tests.calls import INCREMENT
from tests.integration.busproto import until
from tests.integration.services import settings_for
from tests.servers import RedisServer
from tests.unit.test_bindings import lua_files

pytestmark = pytest.mark.anyio


def derived_keys(name: str, keys: Sequence[Arg], args: Sequence[Arg]) -> list[str]:
    """The key names a script builds from its arguments (see each script's header)."""
    def text(arg: Arg) -> str:
        return arg.decode() if isinstance(arg, bytes) else str(arg)

    def written(scopes: Arg) -> list[str]:  # entry.lua's entry_mark_written
        return [text(scopes).removesuffix("scopes") + "written"]

    def value_indexes(key_index: Arg, scope: Arg) -> list[str]:  # includes/indexes.lua
        tag = text(key_index)[:-len(text(scope)) - 2]
        return [f"{tag}ix:{text(scope)}", f"{tag}iv:1:{text(scope)}/n"]

    if name in ("list", "entries"):
        return [text(args[1]) + "somekey"]
    if name == "reap":
        tag = text(args[2])
        return [f"{tag}e:5:scopekey", *[f"{tag}{kind}:scope" for kind in "kut"],
                *written(keys[1]), f"{tag}ix:scope", f"{tag}iv:5:scope/n"]
    if name == "deltopic":
        return [text(args[8]) + "somekey", *written(keys[3]), *value_indexes(keys[1], args[0])]
    if name == "getmany":
        return [text(args[1]) + "somekey"]
    if name == "snaprows":  # the entries its events name (and those of transactions after)
        return [text(args[3]) + "somekey"]
    if name == "bind":
        record = text(keys[0])  # the slices beside it
        return [record + "0", record[:-1]]
    if name == "index":
        return [text(args[2]) + "somekey"]
    if name == "repack":  # the entries or topic indexes it upgrades
        return [text(a) for a in args[1:]]
    if name in ("set", "delete", "update", "topic", "transaction", "delprefix"):
        derived = written(keys[4]) + value_indexes(keys[1], args[0])
        if name in ("transaction", "delprefix"):  # the other entries: ARGV[8] .. <len><scope><key>
            derived.append(text(args[7]) + "somekey")
        if len(keys) > 7:
            record = text(keys[7])  # the slices beside it
            derived += [record + "0", record[:-1]]
        return derived
    return []


async def test_every_script_call_hashes_to_one_slot(
    store: StateStore, scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Sequence[Arg], Sequence[Arg]]] = []
    original = Library.fcall

    def spy(self: Library, name: str, keys: Sequence[Arg], args: Sequence[Arg]) -> list[Arg]:
        calls.append((name, keys, args))
        return original(self, name, keys, args)

    monkeypatch.setattr(Library, "fcall", spy)
    for i, s in enumerate([scope, scope + "x", "é", ""]):
        await store.set(s, f"k{i}", i, ttl_ms=60_000, topic="t")
        await store.compare_and_set(s, f"k{i}", i + 1, expected=i)
        await store.list(s)
        await store.list_keys(s)
        await store.call("state::update", {"scope": s, "key": f"k{i}", "ops": [
            {"type": "set", "path": "", "value": {"n": 1}}]})
        await store.get_entry(s, f"k{i}")  # stores the hash the update left unknown
        await store.call("state::diff", {"scope": s, "key": f"k{i}", "value": 3})
        await store.call("state::update-topic", {"scope": s, "key": f"k{i}", "topic": "u"})
        await store.call("state::list-entries", {"scope": s, "order_by": "updated_at"})
        await store.call("state::delete-by-topic", {"scope": s, "topic_pattern": "x*"})
        await store.get_many(s, [f"k{i}", "absent"])
        await store.delete_by_prefix(s, "zz")
        await store.call("state::create-index", {"scope": s, "pointer": "/n"})  # index.lua
        await store.call("state::drop-index", {"scope": s, "pointer": "/n"})
        await store.delete(s, f"k{i}")
        await store.transaction(s, [{"op": "set", "key": "t1", "value": 1},
                                    {"op": "delete", "key": "t2"}])
        await store.barrier({"key": "a"}, {"id": f"b{s}", "expect": ["a", "b"]})
        await store.barrier({"key": "c"}, {"id": f"gone{s}", "expect": 1})
        await store.delete_barrier(f"gone{s}")  # delbarrier.lua
        listing = await store.call("state::list_entries", {"scope": s, "limit": 1},
                                   caller="c")  # pages.lua: a snapshot kept
        if listing["next_cursor"]:  # (and handed to the next cursor)
            await store.call("state::list_entries", {"scope": s, "limit": 1,
                                                     "cursor": listing["next_cursor"]}, caller="c")
    await store.reap_expired()
    await trigger_leases.reap_triggers(store.state)  # keeptrigger.lua's "reap"
    await store.claim_namespace("billing", [scope + "-private"])  # claims + registry stream
    await store.release_namespace([scope + "-private"], caller="billing")  # the same two
    await store.call("state::register-trigger", {"id": "t", "function_id": "f", "service": "s"})
    await store.call("state::unregister-trigger", {"id": "t"})
    sweeper = Targets(store.state)  # droptarget.lua: "s" unnamed at two sweeps, its stream gone
    assert [await sweeper.sweep([]) for _ in range(2)] == [0, 1]
    await store.call("state::on-config-change", {})  # config.lua
    await principals.add_role(store.state, "r", ["read"], ["*"], False, [])  # access.lua
    leases = Leases(store.state, "token")
    await leases.round()  # lease.lua
    await trimming.position(store.state, min(leases.held), "token")  # advance.lua
    await pipeline(store.state.conn, store.state.library, [ASIDE.command(  # aside.lua
        store.state.library, *aside_call(store.state.keys.partition(min(leases.held)), "token",
                                         "t", ("1-0", 1)))])
    await pipeline(store.state.conn, store.state.library, [  # snapread.lua
        behind.count_command(store.state, store.state.keys.partition(0).snapshot_reads, 0),
        behind.count_command(store.state, store.state.keys.registry_reads, 0)])
    await leases.drop_all()  # (and its heartbeat: the upgrade below refuses a served prefix)
    part = store.state.keys.barrier_partition(f"b{scope}")
    await barriers.forget(store.state, part, [part.barrier(f"b{scope}").encode()], {})  # forget
    # sweep.lua: a bus runtime's dead consumers removed, in the bus's own library
    await swept_consumers(store.state.conn, bus_library(store.state.conn),
                          Sources(store.state.keys.prefix, "svc", [store.state.keys.bus_stream(
                              "svc")]), "svc", "me", 600_000)
    await pipeline(store.state.conn, store.state.library, [SNAPROWS.command(  # snaprows.lua
        store.state.library, *snaprows_call(store.state.keys.for_scope(scope), "0-0", 10,
                                            1 << 20, 10, 1 << 20))])
    await pipeline(store.state.conn, store.state.library, [SNAPPAGE.command(  # snappage.lua
        store.state.library, *snappage_call(store.state.keys.for_scope(scope).unsaved_calls,
                                            "-", 10, 1 << 20))])
    for record in (b"[]", None):  # session.lua: a console session opened, then closed
        await pipeline(store.state.conn, store.state.library, [SESSION.command(
            store.state.library, *session_call(store.state.keys, "d", "p", record, 2**42, 16))])
    restored = generation.new_generation()  # stamp.lua: a restore's first and last steps
    await generation.begin_restore(store.state.conn, store.state.keys, restored)
    await generation.stamp(store.state, restored)
    # repack.lua: an entry of the layout before packed entries, and a topic index, upgraded
    await store.set(scope, "tagged", 1, topic="t")
    at = store.state.keys.for_scope(scope)
    await store.state.conn.execute("HSET", at.entry(scope, "old"), "v", "1", "n", "1")
    await store.state.conn.execute("HDEL", store.state.keys.meta, repack.LAYOUT_FIELD)
    store.state.created = False
    assert await repack.upgrade(store.state) == 1
    # Bus calls on a cluster: the id bound in a step (bind.lua), then the entry script with
    # the partition's records (KEYS[8]) and, with the snapshot on, its unsaved ones (KEYS[9]).
    store.state.cluster = True
    store.state.settings = msgspec.structs.replace(store.state.settings,
                                                   postgres_url="postgresql://unused")
    for fn, body in (("state::set", {"scope": scope, "key": "b", "value": 1}),
                     ("state::get", {"scope": scope, "key": "b"}),
                     # (a step write: its kept reply in its home's unsaved ones, bind.lua)
                     ("state::delete-by-topic", {"scope": scope, "topic_pattern": "t"})):
        bus = CallContext(call_id=f"slot-{fn}", call_digest="0" * 40)
        await store.state.execute(functions.prepare(store.state, fn, msgspec.json.encode(body), bus))
    # get.lua answers a bus call itself: one Redis only (its keys span slots by design; a
    # service on a cluster never lets a script answer: test_answered_only_on_one_redis).
    assert {c[0] for c in calls} == {b.name for b in BINDINGS} - {GET.name}
    files = lua_files()
    for script, keys, args in calls:  # (and each with the ARGV its header declares)
        assert read_header(script, files[script]).admits(len(args)), (script, len(args))
        names = [str(k) for k in keys] + derived_keys(script, keys, args)
        slots = {key_slot(name.encode()) for name in names}
        assert len(slots) == 1, (script, names)


async def test_on_a_cluster_a_bus_call_binds_its_id_in_a_step_unless_at_home(
        store: StateStore, scope: str) -> None:
    """Standalone, an entry script binds the call id itself (one round trip; the binding's
    key is in another slot); on a cluster the binding is a step before the script, unless
    the id's home (keys.id_home) is the scope's partition: then the script's record, in its
    one slot, binds it."""
    space = store.state.keys
    away = next(f"c-{n}" for n in count()
                if space.id_home(call_field(f"c-{n}")) != space.partition_of(scope))
    home = next(f"c-{n}" for n in count()
                if space.id_home(call_field(f"c-{n}")) == space.partition_of(scope))
    ctx = CallContext(call_id=away, call_digest="0" * 40)
    body = msgspec.json.encode({"scope": scope, "key": "k", "value": 1})
    standalone = functions.prepare(store.state, "state::set", body, ctx)
    assert len(standalone.commands) == 1 and standalone.commands[0][0] == "FCALL"
    command = standalone.commands[0]
    keys = command[3:3 + int(command[2])]
    assert any(str(k).startswith(f"{store.state.keys.prefix}:calls:{{") for k in keys), keys
    store.state.cluster = True
    clustered = functions.prepare(store.state, "state::set", body, ctx)
    (bind,) = clustered.commands
    assert bind[:2] == ["FCALL", store.state.library.functions["bind"]]
    script = clustered.finish([[0, 1]])
    (command,) = script.commands
    named = command[3:3 + int(command[2])]
    assert len({key_slot(str(k).encode()) for k in named}) == 1, named
    at_home = functions.prepare(store.state, "state::set", body,
                                CallContext(call_id=home, call_digest="0" * 40))
    (command,) = at_home.commands
    assert command[:2] == ["FCALL", store.state.library.functions["set"]]
    named = command[3:3 + int(command[2])]
    records = space.for_scope(scope).tag + "calls:"  # (its partition's records)
    assert any(str(k).startswith(records) for k in named), named
    assert len({key_slot(str(k).encode()) for k in named}) == 1, named


async def test_function_flush_is_survived(own_redis: RedisServer, scope: str) -> None:
    # FUNCTION FLUSH empties the whole server's library: on a server of the test's own
    async with StateStore.open(own_redis.url, partitions=4) as store:
        await store.set(scope, "k", 1)
        with own_redis.client() as client:
            client.function_flush()
            assert client.function_list() == []
        await store.set(scope, "k", 2)
        assert await store.list(scope) == [2]
        assert await store.delete(scope, "k") == 2
        with own_redis.client() as client:
            assert len(client.function_list()) == 1  # loaded again, once


async def test_redis_restart_is_survived(tmp_path: Path, scope: str) -> None:
    server = RedisServer(tmp_path / "r", appendfsync="always")
    server.start()
    try:
        async with StateStore.open(server.url) as store:
            await store.set(scope, "k", 1)
            server.kill()
            server.start()
            # the first call may find the old connection dead; the next one reconnects
            for _ in range(2):
                try:
                    await store.set(scope, "k", 2)
                    break
                except Exception as exc:
                    assert getattr(exc, "code", None) == "UNAVAILABLE"
            assert await store.get(scope, "k") == 2
            assert (await store.get_entry(scope, "k")).version == 2
    finally:
        server.kill()


async def test_a_library_redis_refuses_to_load_fails_the_call_not_the_store(
    own_redis: RedisServer, scope: str
) -> None:
    # FUNCTION FLUSH and CONFIG SET maxmemory change the whole server: a server of its own
    raw = aredis.Redis(port=own_redis.port)
    try:
        async with StateStore.open(own_redis.url, partitions=4) as store:
            await store.set(scope, "k", 1)
            await raw.function_flush()
            await raw.config_set("maxmemory", 1)  # now Redis refuses FUNCTION LOAD (out of memory)
            try:
                with pytest.raises(StateError) as failed:
                    await store.list(scope)
                assert failed.value.code == "INTERNAL"
                assert "loading the Lua library" in str(failed.value) and "OOM" in str(failed.value)
            finally:
                await raw.config_set("maxmemory", 0)
            # the next call loads the library
            assert await store.list(scope) == [1]
            await store.set(scope, "k", 2)
            assert await store.get(scope, "k") == 2
    finally:
        await raw.aclose()


# ---- the library reloaded under calls already sent -------------------------------------------
async def test_function_flush_while_calls_flow_on_the_bus(own_redis: RedisServer,
                                                         prefix: str, scope: str) -> None:
    """FUNCTION FLUSH (on a server of its own) while 8 clients keep calling: calls whose
    scripts were already on the wire meet "Function not found", the library is loaded again
    and they are repeated; every call succeeds, each write applied once."""
    settings = settings_for(own_redis.url, prefix)
    flushes, writes = 3, [0]
    rounds = [0] * 8  # calls made by each caller
    admin = aredis.Redis(port=own_redis.port)
    stop = anyio.Event()

    async def caller(client: StateClient, n: int) -> None:
        while not stop.is_set():
            await client.update(scope, "counter", INCREMENT)
            writes[0] += 1
            page = await client.list_entries(scope, key_pattern="counter")
            assert [e["key"] for e in page["entries"]] == ["counter"]
            rounds[n] += 1

    async def loaded() -> bool:
        return len(await admin.function_list()) == 1

    try:
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings) as client:
            await client.update(scope, "counter", INCREMENT)
            writes[0] += 1
            async with anyio.create_task_group() as tg:
                for n in range(8):
                    tg.start_soon(caller, client, n)
                for _ in range(flushes):
                    await admin.function_flush()
                    # only a call meeting the missing library loads it again
                    await until(loaded, 10, "the library to be loaded again")
                    # the calls that met it, repeated, are done before the next flush: each
                    # caller finished a round it began after the load
                    since = list(rounds)

                    async def next_rounds(since: list[int] = since) -> bool:
                        return all(now >= then + 2 for now, then in zip(rounds, since,
                                                                         strict=True))

                    await until(next_rounds, 10, "every caller to go on")
                stop.set()
            assert await client.get(scope, "counter") == {"n": writes[0]}
        errors = await admin.info("errorstats")
        assert errors["errorstat_ERR"]["count"] >= flushes  # "ERR Function not found" replies
    finally:
        await admin.aclose()


async def test_answered_unless_strict_waits(store: StateStore) -> None:
    """A script may answer its call (context.Answer; on a cluster where the layout allows:
    tests/integration/cluster/test_answered.py), but not when strict waits for a confirm."""
    calls = StateCalls(store.state)
    assert calls.answers_in_script == {"state::set", "state::get", "state::delete",
                                       "state::update"}
    store.state.confirm.replicas = 1
    assert calls.answers_in_script == frozenset()
