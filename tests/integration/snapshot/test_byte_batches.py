"""A snapshot batch is bounded in bytes, not only in count (found by a hostile trial: after a
PostgreSQL outage the snapshotter read up to 1,000 events of up to ~2 MiB each in one read,
and their entries in one reply). With the budget made small (`rows.BATCH_BYTES`), a catch-up
over large values commits in many batches, each within the budget, every value exact and the
position at the stream's end; a transaction whose events straddle the budget still reaches
PostgreSQL whole; an event larger than the whole budget goes through alone. A restore reads and
writes back in pages bounded the same way (`paged.PAGE_BYTES`).

The tests drive the snapshotter's steps by hand (`Snapshotter._step`): each step commits one
batch of the partition, whose position PostgreSQL holds (`sw_positions`) after it."""

from __future__ import annotations

import itertools

import msgspec
import psycopg
import pytest

from stateworker.keys import KeySpace, call_field
from stateworker.snapshot import barriers, calls, paged, rows
from stateworker.snapshot import restore as restoring
from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state import generation, lifecycle
from tests.integration.snapshot.driven import as_json, opened, snapshot_of, stored_calls
from tests.integration.snapshot.driven import bus_call as call
from tests.integration.snapshot.test_older_copy_between_rounds import stepped
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import calls_saved, caught_up, postgres_entries, redis_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SCOPE = "big"
VALUE = 1_000_000  # characters of a large value (its JSON text: 1,000,002 bytes)


def position_of(url: str, prefix: str, partition: int) -> tuple[str, int] | None:
    """The partition's position as PostgreSQL holds it (last id, events applied)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT last_id, n FROM sw_positions WHERE prefix = %s AND "
                           "partition = %s", (prefix, partition)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


async def batches_until_caught_up(snap: Snapshotter, url: str, partition: int,
                                  most: int) -> list[int]:
    """Steps until the partition's stream is applied; the events each step's commit moved
    PostgreSQL's position by (0: none that step). At most `most` steps."""
    client = snap.state.conn
    start = position_of(url, snap.prefix, partition)
    assert start is not None
    done, moves = start[1], []
    for _ in range(most):
        info = await client.execute("XINFO", "STREAM", snap.state.keys.partition(partition).events)
        added = int(dict(zip(info[::2], info[1::2], strict=True))[b"entries-added"])
        if done == added:
            return moves
        await snap._step()
        now = position_of(url, snap.prefix, partition)
        assert now is not None
        moves.append(now[1] - done)
        done = now[1]
    raise AssertionError(f"not caught up after {most} steps: moved by {moves}")


async def test_a_catch_up_over_large_values_commits_in_batches_within_the_budget(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """50 events of ~1 MiB values (25 keys set, then set again: the second events hold the
    old value too) under a 3 MiB budget: an event and its entry are 2 or 3 MB, so a batch
    stops after its second event at the latest (the first that reaches the budget); without
    the bound it was one batch of all 50. PostgreSQL gets every value exactly."""
    monkeypatch.setattr(rows, "BATCH_BYTES", 3 << 20)
    settings = settings_for(own_redis.url, prefix, postgres_url)
    keys = KeySpace(prefix, PARTITIONS)
    partition = keys.partition_of(SCOPE)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()  # (a round: the partition's position, at its stream's end)
        assert partition in snap.positions
        start = position_of(postgres_url, prefix, partition)
        assert start is not None
        for n in range(50):  # (PostgreSQL away: nothing committed while they are written)
            await call(state, "state::set", {"scope": SCOPE, "key": f"k{n % 25}",
                                             "value": f"{n:03}" + "x" * VALUE}, f"c{n}")
        moves = await batches_until_caught_up(snap, postgres_url, partition, 60)
        assert sum(moves) == 50 and all(1 <= m <= 2 for m in moves), moves
        client = own_redis.client()
        assert caught_up(client, keys)
        last = client.xinfo_stream(keys.partition(partition).events)["last-generated-id"]
        assert position_of(postgres_url, prefix, partition) == (last.decode(), start[1] + 50)
        held = postgres_entries(postgres_url, prefix)
        assert held == redis_entries(client, keys) and len(held) == 25
        assert {key: text[:4] for (_, key), (text, *_) in held.items()} == {
            f"k{n}": f'"{n + 25:03}' for n in range(25)}


async def test_a_transaction_across_the_byte_budget_reaches_postgres_whole(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction of 40 writes of 50 KB after two small writes, under a 256 KiB budget:
    the budget ends inside it (an event and its entry are ~100 KB), and its events after
    that are more than the events examined after a batch (1 MiB of them). After every
    commit PostgreSQL holds all of its writes or none."""
    monkeypatch.setattr(rows, "BATCH_BYTES", 256 << 10)
    settings = settings_for(own_redis.url, prefix, postgres_url)
    partition = KeySpace(prefix, PARTITIONS).partition_of(SCOPE)
    written = {f"t{n:02}": f"{n:02}" + "y" * 50_000 for n in range(40)}
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        for n in range(2):
            await call(state, "state::set", {"scope": SCOPE, "key": f"s{n}", "value": n},
                       f"s{n}")
        await call(state, "state::transaction", {"scope": SCOPE, "ops": [
            {"op": "set", "key": key, "value": value} for key, value in written.items()]},
            "c-tx")
        await call(state, "state::set", {"scope": SCOPE, "key": "after", "value": 1}, "after")
        seen = []
        for _ in range(10):
            await snap._step()
            held = snapshot_of(postgres_url, prefix)
            of_tx = {key for (_, key) in held if key in written}
            seen.append(len(of_tx))
            assert of_tx in (set(), set(written)), f"a part of the transaction: {sorted(of_tx)}"
            if (SCOPE, "after") in held:
                break
        assert held[(SCOPE, "t39")] == ('"39' + "y" * 50_000 + '"', 1), seen
        position = position_of(postgres_url, prefix, partition)
        assert position is not None and position[1] == 43


async def test_an_event_larger_than_the_budget_goes_through_alone(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a 64 KiB budget, three events of ~1 MiB values: each is a batch of its own
    (taken, not skipped nor waited on for ever), and each value arrives exactly."""
    monkeypatch.setattr(rows, "BATCH_BYTES", 64 << 10)
    settings = settings_for(own_redis.url, prefix, postgres_url)
    keys = KeySpace(prefix, PARTITIONS)
    partition = keys.partition_of(SCOPE)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        for n in range(3):
            await call(state, "state::set", {"scope": SCOPE, "key": f"k{n}",
                                             "value": f"{n}" + "z" * VALUE}, f"c{n}")
        assert await batches_until_caught_up(snap, postgres_url, partition, 10) == [1, 1, 1]
        assert postgres_entries(postgres_url, prefix) == redis_entries(own_redis.client(), keys)


@pytest.mark.parametrize(("budget", "pages"), [(3 << 20, [4, 4, 4, 30]),
                                               (64 << 10, [1] * 12 + [30])])
async def test_a_restore_writes_back_in_pages_within_the_budget(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch, budget: int, pages: list[int]) -> None:
    """12 values of ~1 MB (keys b00..b11, first in key order; each written twice, so the
    second call's record holds the first value) and 30 small ones, each write a bus call: a
    restore reads and writes them back a page at a time, a page ending after the row that
    reaches the budget (3 MiB: four large rows; 64 KiB: each large row alone, not skipped),
    every value exact; its progress climbs page by page to the total; the records come back
    in pages too, and a retry of each call after it is answered from its record, not applied
    again."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    keys = KeySpace(prefix, PARTITIONS)
    partition = keys.partition_of(SCOPE)
    bodies = [(f"c0-b{n:02}", {"scope": SCOPE, "key": f"b{n:02}", "value": "0" + "v" * VALUE})
              for n in range(12)]
    bodies += [(f"c-b{n:02}", {"scope": SCOPE, "key": f"b{n:02}", "value": f"{n:02}" + "w" * VALUE})
               for n in range(12)]
    bodies += [(f"c-s{n:02}", {"scope": SCOPE, "key": f"s{n:02}", "value": n}) for n in range(30)]
    replies = {}
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        for call_id, body in bodies:
            replies[call_id] = await call(state, "state::set", body, call_id)
        await batches_until_caught_up(snap, postgres_url, partition, 40)
    client = own_redis.client()
    assert calls_saved(client, keys)
    before = redis_entries(client, keys)
    assert len(before) == 42

    client.flushall()
    monkeypatch.setattr(paged, "PAGE_BYTES", budget)
    progress: list[tuple[int, int]] = []
    async with lifecycle.open_state(settings=settings, reaper=False) as state:
        summary = await restoring.restore(state, postgres_url,
                                          lambda done, total: progress.append((done, total)))
    assert (summary.entries, summary.calls) == (42, len(bodies))
    assert [done for done, _ in progress] == list(itertools.accumulate(pages))
    assert {total for _, total in progress} == {42}
    assert redis_entries(client, keys) == before

    async with opened(settings) as state:
        for call_id, body in bodies:
            again = await call(state, "state::set", body, call_id)
            assert as_json(again) == as_json(replies[call_id]), call_id
    assert redis_entries(client, keys) == before  # (no version 2 anywhere)


async def test_a_batch_carries_every_record_of_its_rows_across_record_pages(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of one event (rows.BATCH = 1) reads its key as it is now, ten calls later: it
    carries the records of all eleven calls (each of the last ten holding a 100 KB old value),
    read a page of about 64 KiB at a time inside its commit. After that one commit PostgreSQL
    holds every record with the change; restored from it, a retry of each call is answered
    from its record and none is applied again."""
    monkeypatch.setattr(rows, "BATCH", 1)
    monkeypatch.setattr(calls, "BATCH_BYTES", 64 << 10)
    settings = settings_for(own_redis.url, prefix, postgres_url)
    bodies = [(f"h{n:02}", {"scope": SCOPE, "key": "hot", "value": f"{n:02}" + "h" * 100_000})
              for n in range(11)]
    replies = {}
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        for call_id, body in bodies:
            replies[call_id] = await call(state, "state::set", body, call_id)
        await snap._step()
        assert snapshot_of(postgres_url, prefix)[(SCOPE, "hot")][1] == 11
        assert stored_calls(postgres_url, prefix) == {call_field(c) for c, _ in bodies}
    client = own_redis.client()
    client.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        for call_id, body in bodies:
            again = await call(state, "state::set", body, call_id)
            assert as_json(again) == as_json(replies[call_id]), call_id
    entry = redis_entries(client, KeySpace(prefix, PARTITIONS))[(SCOPE, "hot")]
    assert entry[1] == 11 and entry[0].startswith('"10')


def reads_of(url: str, prefix: str, partition: int) -> int:
    """The count of the partition's reads PostgreSQL committed (one per commit of a read)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT reads FROM sw_reads WHERE prefix = %s AND partition = %s",
                           (prefix, partition)).fetchone()
    return 0 if row is None else int(row[0])


async def test_a_rescan_reads_its_partition_in_parts_and_commits_it_whole(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten values of ~1 MB written before any snapshot followed their partition: its first
    round rescans it, under a 3 MiB budget reading three parts (four, four, two entries: one
    GET pipeline each, counted below), all in one commit with every call record. Every
    value and record arrives. (Leases of 30 s: a step renews none, and the rescan of 10 MB
    may take longer than the others' 1 s.)"""
    monkeypatch.setattr(rows, "BATCH_BYTES", 3 << 20)
    settings = msgspec.structs.replace(settings_for(own_redis.url, prefix, postgres_url),
                                       lease_ms=30_000)
    keys = KeySpace(prefix, PARTITIONS)
    async with opened(settings) as state:
        for n in range(10):
            await call(state, "state::set", {"scope": SCOPE, "key": f"r{n}",
                                             "value": f"{n}" + "r" * VALUE}, f"r{n}")
        parts = [len(found) async for found in rows.scan_partition(
            state, keys.for_scope(SCOPE), (await generation.read(state.conn, state.keys)).meta
            or "")]
        assert sorted(parts) == [2, 4, 4]
        async with stepped(state, postgres_url) as snap:
            await snap._step()  # (its first round: the partition never snapshotted)
        client = own_redis.client()
        assert postgres_entries(postgres_url, prefix) == redis_entries(client, keys)
        assert stored_calls(postgres_url, prefix) == {call_field(f"r{n}") for n in range(10)}
        assert calls_saved(client, keys)


async def test_changed_barriers_are_stored_in_parts_within_the_budget(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Six barriers of one partition waiting with an arrival that carries 600 KB: under a
    1 MiB budget the round stores them in three parts of two, each read and committed with
    its own count, every barrier's fields exact in PostgreSQL."""
    monkeypatch.setattr(barriers, "BATCH_BYTES", 1 << 20)
    settings = settings_for(own_redis.url, prefix, postgres_url)
    keys = KeySpace(prefix, PARTITIONS)
    ids = [i for i in (f"wide-{n}" for n in range(100))
           if keys.barrier_partition(i) is keys.partition(0)][:6]
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()  # (a round: the partitions' barriers followed)
        before = reads_of(postgres_url, prefix, 0)
        for n, barrier_id in enumerate(ids):
            await call(state, "state::barrier", {
                "event": {"key": "a", "blob": f"{n}" + "b" * 600_000},
                "condition_config": {"id": barrier_id, "expect": 2}}, f"arrive-{n}")
        snap._last_round = 0.0
        await snap._step()  # (the next round stores the changed barriers)
        assert reads_of(postgres_url, prefix, 0) - before == 3
        client = own_redis.client()
        with psycopg.connect(postgres_url) as conn:
            held = dict(conn.execute("SELECT id, exact FROM sw_barriers WHERE prefix = %s",
                                     (prefix,)).fetchall())
        assert {i: msgspec.msgpack.decode(held[i]) for i in ids} == {
            i: client.hgetall(keys.barrier_partition(i).barrier(i)) for i in ids}
        assert not client.scard(keys.partition(0).barriers_changed)
