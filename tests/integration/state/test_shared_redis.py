"""One caller's call against what every caller shares (docs/decisions/0041): Redis runs one
script at a time, so no call may walk a whole scope in one script, and no caller may grow
what the others need without bound. Each test builds the data as an attacker would, on a
Redis of its own, and reads what Redis ran (its SLOWLOG, every command logged) and holds:
never how long anything took."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from stateworker import StateStore
from stateworker.app import console_reads
from stateworker.errors import InvalidRequest, SnapshotCapacity
from stateworker.state import expiry
from stateworker.state.kv import listing, reads
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

LIST_CHUNK = 1000  # keys one script of a listing reads, at most (state/kv/reads.py)


@pytest.fixture
async def two(own_redis: RedisServer, prefix: str) -> AsyncIterator[tuple[StateStore, StateStore]]:
    """Two callers (a connection each) on one Redis of the test's own."""
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=4, reaper=False) as a, \
            StateStore.open(own_redis.url, prefix=prefix, partitions=4, reaper=False) as b:
        yield a, b


def logging_every_command(server: RedisServer) -> None:
    client = server.client()
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 1_000_000)
    client.slowlog_reset()


def ran(server: RedisServer) -> list[list[str]]:
    """Every command Redis ran since `logging_every_command`, oldest first (each as its
    first arguments, as the slowlog keeps them)."""
    entries = server.client().execute_command("SLOWLOG", "GET", -1)
    return [[a.decode(errors="replace") for a in entry[3]] for entry in reversed(entries)]


def script(command: list[str]) -> str | None:
    """The script an FCALL ran (`list`, `set` ...), None for any other command."""
    if command[0].upper() not in ("FCALL", "FCALL_RO"):
        return None
    return command[1].rsplit("_", 1)[1]


async def test_a_whole_scope_listing_lets_other_callers_in(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """state::list and state::list_keys of a scope of 20,000 keys (and values large enough
    to end a chunk early) read it in scripts of at most LIST_CHUNK keys, and the other
    caller's writes run between them; the result is still the whole scope in key order."""
    lister, writer = two
    big = "v" * 600_000
    expected: dict[str, Any] = {f"a{i}": big for i in range(3)}
    expected |= {f"k{i:06d}": i for i in range(20_000)}
    items = list(expected.items())
    for start in range(0, len(items), 1000):
        await lister.call("state::set-many", {"scope": "big", "entries": [
            {"key": k, "value": v} for k, v in items[start:start + 1000]]})
    logging_every_command(own_redis)
    done = anyio.Event()
    writes = 0

    async def write_meanwhile() -> None:
        nonlocal writes
        while not done.is_set():
            await writer.set("elsewhere", f"w{writes}", writes)
            writes += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(write_meanwhile)
        keys = (await lister.call("state::list_keys", {"scope": "big"}))["keys"]
        values = await lister.call("state::list", {"scope": "big"})
        done.set()
    assert keys == list(expected)  # (in byte order already)
    assert values == list(expected.values())

    log = ran(own_redis)
    for what in ("keys", "values"):  # (FCALL name 1 key-index now prefix what start most ...)
        listing = [i for i, command in enumerate(log)
                   if script(command) == "list" and command[6] == what]
        assert len(listing) > len(expected) // LIST_CHUNK, what
        assert all(int(log[i][8]) <= LIST_CHUNK for i in listing), what
        between = [command for command in log[listing[0]:listing[-1]]
                   if script(command) == "set"]
        assert between, f"no other caller's write ran while the scope's {what} were listed"


async def test_list_groups_reads_the_scopes_in_chunks_and_lets_other_callers_in(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """state::list_groups read each partition's whole scopes index in one command (21 ms a
    partition at 300,000 scopes, and sorting the names held the service's loop 0.4 s). It
    reads them as list-namespaces does, at most NAMESPACES_CHUNK_MAX names a command, and the
    other caller's writes run between; the answer is still every scope in byte order."""
    lister, writer = two

    async def fill(first: int) -> None:
        for i in range(first, 20_000, 50):
            await lister.set(f"s{i:05d}", "k", i)

    async with anyio.create_task_group() as tg:
        for first in range(50):
            tg.start_soon(fill, first)
    logging_every_command(own_redis)
    done = anyio.Event()

    async def write_meanwhile() -> None:
        n = 0
        while not done.is_set():
            await writer.set("elsewhere", f"w{n}", n)
            n += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(write_meanwhile)
        groups = await lister.list_groups()
        done.set()
    assert [g for g in groups if g != "elsewhere"] == [f"s{i:05d}" for i in range(20_000)]
    log = ran(own_redis)
    reads = [i for i, command in enumerate(log)
             if command[0] == "ZRANGE" and command[1].endswith(":scopes")]
    assert len(reads) > 20_000 // listing.NAMESPACES_CHUNK_MAX
    assert all(log[i][4:6] == ["BYLEX", "LIMIT"] and int(log[i][7]) <=
               listing.NAMESPACES_CHUNK_MAX for i in reads), [log[i] for i in reads][:3]
    assert any(script(command) == "set" for command in log[reads[0]:reads[-1]]), \
        "no other caller's write ran while the scopes were read"


async def claim(store: StateStore, prefix: str, scopes: list[str]) -> Any:
    return await store.call("state::claim-namespace",
                            {"functions_prefix": prefix, "scopes": scopes}, caller=prefix)


async def test_one_namespace_cannot_claim_scopes_without_end(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """Every claim and release reads the whole claims hash (and every replica and the snapshot
    hold it): one namespace owns at most 1,000 scopes, all of them together 10,000. A claim
    past either is INVALID_REQUEST naming `$.scopes` and the limit, and claims nothing."""
    hog, other = two
    assert (await claim(hog, "hog", [f"hog-{i}" for i in range(1000)]))["claimed"] is True
    with pytest.raises(InvalidRequest) as refused:
        await claim(hog, "hog", ["hog-1000", "hog-1001"])
    assert refused.value.details == {"path": "$.scopes", "limit": 1000, "scopes": 1002,
                                     "of": "namespace"}
    assert "1000" in refused.value.message and "$.scopes" in refused.value.message
    for n in range(1, 10):  # (nine more namespaces fill the room)
        await claim(other, f"ns{n}", [f"ns{n}-{i}" for i in range(1000)])
    with pytest.raises(InvalidRequest) as full:
        await claim(other, "late", ["late-0"])
    assert full.value.details == {"path": "$.scopes", "limit": 10_000, "scopes": 10_001,
                                  "of": "all"}
    claims = own_redis.client().hgetall(f"{hog.settings.prefix}:{{{hog.settings.prefix}:reg}}:claims")
    assert len(claims) == 10_000 and b"hog-1000" not in claims and b"late-0" not in claims
    # (claiming again what it owns is no growth: still answered)
    assert (await claim(hog, "hog", ["hog-0"]))["claimed"] is False
    await other.call("state::release-namespace", {"scopes": ["ns1-0"]}, caller="ns1")
    assert (await claim(other, "late", ["late-0"]))["claimed"] is True


async def test_one_caller_cannot_fill_the_trigger_registry_with_large_registrations(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """Every replica reloads every registration on each change (and the snapshot copies them,
    a claim reads them): the registrations hold at most 16 MiB of JSON together. A caller
    registering 60 KiB registrations over and over is refused with INVALID_REQUEST naming
    `$.config` and the limit, long before the 10,000 of them (600 MiB) it could make."""
    hog, _ = two
    equals = '"' + "x" * 60_000 + '"'
    limit, refused = 16 * 1024 * 1024, None
    for n in range(400):  # (400 x 60 KiB: 24 MiB asked for)
        try:
            await hog.call("state::register-trigger", {
                "function_id": "h::f", "service": "svc", "id": f"hog-{n}",
                "config": {"match": [{"pointer": "/value", "equals": equals}]}})
        except InvalidRequest as exc:
            refused = exc
            break
    assert refused is not None, "400 registrations of 60 KiB were all kept"
    assert refused.details["path"] == "$.config" and refused.details["limit"] == limit
    assert str(limit) in refused.message
    held = own_redis.client().hvals(f"{hog.settings.prefix}:{{{hog.settings.prefix}:reg}}:triggers")
    assert sum(map(len, held)) <= limit and len(held) == n
    # (replacing one with one no larger is no growth: still done)
    await hog.call("state::register-trigger", {"function_id": "h::g", "service": "svc",
                                               "id": "hog-0"})
    listed = await hog.call("state::list-triggers", {})
    assert len(listed["triggers"]) == n


async def test_the_console_overview_finds_barriers_without_walking_the_keyspace(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """The console polls its overview every 2 s, and the overview found barriers by SCAN: in
    a keyspace of 100,000 keys one poll walked it to the end once per partition (400 SCANs
    here, 16,000 at a million keys). It reads each partition's barrier index now: no SCAN,
    every barrier found, a deleted one gone, and an expired one dropped by the reaper."""
    store, _ = two
    for n in range(3):
        await store.call("state::barrier", {"event": {"key": "a"},
                                            "condition_config": {"id": f"b-{n}", "expect": 2}})
    client = own_redis.client()
    with client.pipeline(transaction=False) as pipe:
        for i in range(100_000):
            pipe.set(f"other-app:{i}", "1")
        pipe.execute()
    async with StateStore.open(own_redis.url, prefix=store.settings.prefix, partitions=4,
                               reaper=False, barrier_ttl_s=1) as brief:
        await brief.call("state::barrier", {"event": {"key": "a"},
                                            "condition_config": {"id": "done", "expect": 1}})
    client.config_resetstat()
    found = await console_reads._barriers(store.state)
    assert [b["id"] for b in found["barriers"]] == ["b-0", "b-1", "b-2", "done"]
    assert found["more"] is False and found["barriers"][-1]["complete"] is True
    assert "cmdstat_scan" not in client.info("commandstats")
    await store.call("state::delete-barrier", {"id": "b-1"})
    await anyio.sleep(1.1)  # ("done" completed with barrier_ttl_s 1: its hash expires)
    await expiry.reaper_round(store.state)
    found = await console_reads._barriers(store.state)
    assert [b["id"] for b in found["barriers"]] == ["b-0", "b-2"]
    held = [client.zrange(part.barriers, 0, -1) for part in store.state.keys.all_partitions()]
    assert sorted(name.rsplit(b":", 1)[1] for names in held for name in names) == [b"b-0", b"b-2"]


async def test_a_list_entries_snapshot_of_a_large_scope_is_refused_before_it_is_taken(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """state::list_entries captures its snapshot in one script (a snapshot is one point in
    time): at 100,000 entries that held every caller 1.35 s. A scope of more than 5,000 keys
    is SNAPSHOT_CAPACITY (`bound` entries, the limit), nothing kept, and the script read at
    most one key past the bound; 5,000 are still listed."""
    store, _ = two
    for start in range(0, 20_000, 1000):
        await store.call("state::set-many", {"scope": "big", "entries": [
            {"key": f"k{i:06d}", "value": i} for i in range(start, start + 1000)]})
    with pytest.raises(SnapshotCapacity) as refused:
        await store.call("state::list_entries", {"scope": "big"}, caller="hog")
    assert refused.value.details == {"path": "$.scope", "limit": 5000, "found": 20_000,
                                     "bound": "entries"}
    assert not own_redis.client().keys(f"{store.settings.prefix}:*:snap:*")
    for prefix in ("k005", "k006", "k007", "k008", "k009", "k01"):  # (5,000 left)
        while (await store.call("state::delete-by-prefix", {"scope": "big", "prefix": prefix,
                                                            "limit": 10_000}))["more"]:
            pass
    page = await store.call("state::list_entries", {"scope": "big", "limit": 1000}, caller="hog")
    assert page["total"] == 5000 and len(page["entries"]) == 1000


async def test_a_delete_by_prefix_of_the_highest_limit_is_answered_in_batches(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """A delete-by-prefix batch is one script (its deletes recorded with the call's reply):
    with `limit` 10,000 one script deleted 10,000 entries, an event each (~180 ms). A call
    deletes 1,000 at most whatever its limit, answers `more`, and the next goes on."""
    store, _ = two
    for start in range(0, 10_000, 1000):
        await store.call("state::set-many", {"scope": "big", "entries": [
            {"key": f"job:{i:05d}", "value": i} for i in range(start, start + 1000)]})
    logging_every_command(own_redis)
    answers = []
    while not answers or answers[-1]["more"]:
        answers.append(await store.call("state::delete-by-prefix",
                                        {"scope": "big", "prefix": "job:", "limit": 10_000}))
    assert answers == [{"deleted": 1000, "more": True}] * 9 + [{"deleted": 1000, "more": False}]
    assert await store.call("state::list_keys", {"scope": "big"}) == {"keys": []}
    assert len(await store.events("big")) == 20_000  # (a created and a deleted event each)
    assert all(int(command[-2]) <= 1000 for command in ran(own_redis)  # (ARGV[12]: examined)
               if script(command) == "delprefix")


async def test_a_dropped_index_of_a_large_scope_is_freed_in_the_background(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """Freeing a sorted set is O(its members) in the thread that runs the scripts: a dropped
    index of 200,000 keys freed there held every caller ~30 ms (more with the scope). The
    drop unlinks it: Redis frees it in its background thread (INFO memory: lazyfreed_objects)."""
    store, _ = two
    for start in range(0, 20_000, 1000):
        await store.call("state::set-many", {"scope": "big", "entries": [
            {"key": f"k{i:06d}", "value": i} for i in range(start, start + 1000)]})
    while (await store.call("state::create-index", {"scope": "big", "pointer": ""}))["building"]:
        pass
    client = own_redis.client()
    before = client.info("memory")["lazyfreed_objects"]
    assert await store.call("state::drop-index", {"scope": "big", "pointer": ""}) == {
        "dropped": True}
    for _ in range(500):  # (counted once the background thread has freed it)
        if client.info("memory")["lazyfreed_objects"] > before:
            break
        await anyio.sleep(0.01)
    assert client.info("memory")["lazyfreed_objects"] == before + 1
    query = await store.call("state::query", {"scope": "big", "where": [
        {"pointer": "", "op": "eq", "value": 7}]})
    assert [e["key"] for e in query["entries"]] == ["k000007"] and "index" not in query


async def test_a_barrier_of_many_arrivals_completes_with_its_keys_sorted_by_redis(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """The arrival completing a barrier builds its payload, every key's result in byte order,
    in one script: sorted with a Lua comparator (Redis's Lua compares strings by the locale),
    10,000 keys held every caller ~140 ms. Redis sorts them now (a sorted set of equal scores,
    for a moment, in the barrier's own key): the payload is the same, keys in byte order."""
    store, _ = two
    keys = [f"k{i}" for i in range(3000)] + ["", "K", "k", "é", "z\u0000", "~"]
    shuffled = sorted(keys, key=lambda k: hash(k))
    client = own_redis.client()
    for n, key in enumerate(shuffled):
        if n == len(keys) - 1:
            client.config_resetstat()
        decision = await store.call("state::barrier", {
            "event": {"key": key, "n": n}, "condition_config": {
                "id": "many", "expect": len(keys), "carry": "/n"}})
    assert decision["decision"] == "allow"
    results = decision["payload"]["results"]
    assert list(results) == sorted(keys, key=str.encode)
    assert results == {key: n for n, key in enumerate(shuffled)}
    again = await store.call("state::barrier", {"event": {"key": "k1", "n": 0},
                                                "condition_config": {"id": "many",
                                                                     "expect": len(keys)}})
    assert again["decision"] == "skip"
    # (a script's commands count in INFO commandstats: the completing one sorted by ZADD)
    assert "cmdstat_zadd" in client.info("commandstats"), "the keys were sorted in Lua"
    held = client.hgetall(store.state.keys.barrier_partition("many").barrier("many"))
    assert set(held) == {b"e", b"E", b"n", b"c", b"d", b"t", b"z", b"w"}


async def test_scripts_over_many_entries_read_a_bounded_number_of_bytes(
        own_redis: RedisServer, two: tuple[StateStore, StateStore]) -> None:
    """Every script that walks a scope's entries reads each one whole (a GET of its stored
    form), whatever it returns: 64 entries of 1 MiB held Redis 0.27 s in one list-entries
    page without their values, 0.36 s in one list_keys chunk, 0.21 s in one index build batch
    and 0.42 s in one reaper batch. Each now stops once its reads reach its byte budget:
    list_keys LIST_BYTES a chunk, the others max_call_bytes (a page comes back short with its
    cursor; the build and the reaper go on in the next batch)."""
    store, _ = two
    big = "v" * 600_000
    for n in range(20):
        await store.call("state::set", {"scope": "big", "key": f"k{n:02d}", "value": big})
        await store.call("state::set", {"scope": "brief", "key": f"k{n:02d}", "value": big,
                                        "ttl_ms": 1})
    client = own_redis.client()
    size = client.strlen(store.state.keys.for_scope("big").entry("big", "k00"))
    budget = store.settings.max_call_bytes
    logging_every_command(own_redis)
    assert (await store.list_keys("big")) == [f"k{n:02d}" for n in range(20)]
    chunks = [c for c in ran(own_redis) if script(c) == "list"]
    per_chunk = -(-reads.LIST_BYTES // size)  # (a chunk ends after the entry reaching it)
    assert len(chunks) >= -(-20 // per_chunk) == 10, len(chunks)
    page = await store.call("state::list-entries", {"scope": "big", "limit": 1000})
    assert len(page["entries"]) == -(-budget // size) and "next_after" in page
    logging_every_command(own_redis)
    while (await store.call("state::create-index", {"scope": "big", "pointer": "/x"}))[
            "building"]:
        pass
    builds = [c for c in ran(own_redis) if script(c) == "index" and c[7] == "build"]  # (FCALL name 4 KEYS op)
    assert len(builds) >= -(-20 // -(-budget // size)), len(builds)
    part = store.state.keys.for_scope("brief")
    await anyio.sleep(0.01)  # (their 1 ms passes)
    assert await expiry.reap_partition(store.state, part) == (budget // size, True)
    assert await store.reap_expired() == 20 - budget // size
