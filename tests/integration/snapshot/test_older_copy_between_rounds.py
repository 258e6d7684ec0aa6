"""A Redis restarted on an older copy of its data (an older AOF; a replica promoted before it
synced) while the snapshotter sits between two rounds: the lean connection reconnects
without a word, so no error tells the snapshotter, and its positions are still in memory.
Nothing the older copy holds reaches PostgreSQL: its next batch is fenced before anything is
committed, the partition is reported behind and its writes refused, and a restore brings back
the newer value PostgreSQL kept.

The tests drive the snapshotter's steps by hand (`Snapshotter._step`, and `_step_failed` as
its loop does with an error) so the restart lands exactly between two rounds."""

from __future__ import annotations

import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import psycopg
import pytest

from stateworker import StateError
from stateworker.app.cli import status_report
from stateworker.keys import KeySpace
from stateworker.snapshot import restore
from stateworker.snapshot.generation import Fenced
from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state import generation
from stateworker.state.core.store import RedisState
from tests.integration.busproto import until
from tests.integration.snapshot.driven import bus_call as call
from tests.integration.snapshot.driven import opened
from tests.integration.snapshot.test_lost_redis import swap_data
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import postgres_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def stepped(state: RedisState, url: str) -> AsyncIterator[Snapshotter]:
    """A snapshotter whose steps the test drives; its connections and leases closed after."""
    snap = Snapshotter(state, url)
    try:
        yield snap
    finally:
        await snap._close()


async def steps_until(snap: Snapshotter, holds: Any, what: str, rounds: bool = False) -> None:
    """Snapshot steps until `holds()` (bounded); `rounds`: a round at every step."""
    for _ in range(60):
        if rounds:
            snap._last_round = 0.0
        await snap._step()
        if holds():
            return
    raise AssertionError(f"the snapshot never reached {what}")


async def restarted_on(server: RedisServer, directory: Path | None, snap: Snapshotter) -> None:
    """Redis stopped cleanly and started again (on a copy of its data in `directory`, if
    given); back once it answers and the snapshotter's reader has seen its socket closed (its
    next read reconnects without an error, the case under test)."""
    if directory is None:
        server.kill(signal.SIGTERM)
        server.start()
    else:
        swap_data(server, directory)
    await until(lambda: server.answers() and not snap._reader.conn.is_open, 10,
                "Redis back, the old socket closed")


async def written(state: RedisState, value: Any, call_id: str) -> int:
    """s/k set to `value` (retried while the state's connection still meets the old
    socket); its version."""
    versions: list[int] = []

    async def attempt() -> bool:
        try:
            versions.append((await call(state, "state::set", {
                "scope": "s", "key": "k", "value": value}, call_id)).version)
        except StateError as exc:
            assert exc.code == "UNAVAILABLE", exc
        return bool(versions)
    await until(attempt, 10, f"the write of {value}")
    return versions[0]


async def test_a_batch_read_from_an_older_copy_after_a_silent_reconnect_commits_nothing(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    partition = KeySpace(prefix, PARTITIONS).partition_of("s")
    older = tmp_path / "older"
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        assert await written(state, 1, "c1") == 1
        await steps_until(snap, lambda: postgres_entries(postgres_url, prefix).get(
            ("s", "k"), ())[:2] == ("1", 1), "version 1")
        own_redis.kill(signal.SIGTERM)  # (a clean stop: a complete AOF to copy)
        shutil.copytree(own_redis.directory, older)
        own_redis.start()
        await restarted_on(own_redis, None, snap)
        assert await written(state, 2, "c2") == 2
        assert await written(state, 3, "c3") == 3
        await steps_until(snap, lambda: postgres_entries(postgres_url, prefix).get(
            ("s", "k"), ())[:2] == ("3", 3), "version 3")
        truth = postgres_entries(postgres_url, prefix)

        await restarted_on(own_redis, older, snap)
        # The older copy has the same markers: it accepts the write, on its version 1.
        assert await written(state, "stale", "c4") == 2
        # The restart came between two rounds (the last one just now): the next step reads
        # the stale write with the positions of before, no round's check first.
        snap._last_round = anyio.current_time()
        with pytest.raises(Fenced) as fenced:
            await snap._step()
        assert fenced.value.code == "STORE_LOST"
        assert (f"partition {partition}'s event stream has had 2 events added, PostgreSQL "
                "applied 3") in fenced.value.message
        assert "behind the snapshot" in fenced.value.message
        await snap._step_failed(fenced.value)  # (the loop's answer: positions forgotten)
        assert postgres_entries(postgres_url, prefix) == truth

        # The next round (due at once, not after the loop's backoff) finds the partition
        # behind: reported, and its writes refused.
        snap._last_round = 0.0
        await snap._step()
        assert postgres_entries(postgres_url, prefix) == truth
        markers = await generation.read(state.conn, state.keys)
        assert markers.partitions[partition] is None
        report = (await status_report(settings))["store_lost"]
        assert f"partition {partition}'s event stream has had" in report
        assert "behind" in report
        with pytest.raises(StateError) as refused:
            await call(state, "state::set", {"scope": "s", "key": "k", "value": 5}, "c5")
        assert refused.value.code == "STORE_LOST"

        # The recovery: the older copy's keys gone, a restore brings back PostgreSQL's value.
        own_redis.client().flushall()
        await restore.restore(state, postgres_url)
        got = await call(state, "state::get", {"scope": "s", "key": "k"}, "c6")
        assert msgspec.json.decode(got) == 3
        assert await written(state, "after", "c7") == 4  # (on from PostgreSQL's version)


CONFIG = {"id": "B", "expect": ["a", "b", "c", "d", "e"]}


def pg_barrier(url: str, prefix: str) -> tuple[int, list[str]] | None:
    """PostgreSQL's row of barrier B: its write count and the keys arrived."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT w, fields FROM sw_barriers WHERE prefix = %s AND id = 'B'",
                           (prefix,)).fetchone()
    if row is None:
        return None
    return int(row[0]), sorted(name[1:] for name in row[1] if name.startswith("a"))


async def arrive(state: RedisState, key: str, call_id: str) -> str:
    result = await call(state, "state::barrier", {"event": {"key": key},
                                                   "condition_config": CONFIG}, call_id)
    return str(result.decision)


async def barrier_behind(own_redis: RedisServer, prefix: str, postgres_url: str,
                         older: Path, arrivals_on_the_copy: list[str], why: str) -> None:
    """B with `a` and `b` in PostgreSQL, Redis restarted on a copy from when it had `a`
    only, `arrivals_on_the_copy` taken there (before the snapshotter's next round): nothing
    of the copy is stored over PostgreSQL's B, the partition is behind (`why`; its writes
    refused), and a restore brings `a` and `b` back."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    keys = KeySpace(prefix, PARTITIONS)
    partition = keys.all_partitions().index(keys.barrier_partition("B"))
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        assert await arrive(state, "a", "b1") == "skip"
        await steps_until(snap, lambda: pg_barrier(postgres_url, prefix) == (1, ["a"]),
                          "B with a", rounds=True)  # (barriers are stored once a round)
        own_redis.kill(signal.SIGTERM)  # (a clean stop: a complete AOF to copy)
        shutil.copytree(own_redis.directory, older)
        own_redis.start()
        await restarted_on(own_redis, None, snap)
        acked: list[str] = []

        async def arrived() -> bool:  # (retried while the state meets the old socket)
            try:
                acked.append(await arrive(state, "b", "b2"))
            except StateError as exc:
                assert exc.code == "UNAVAILABLE", exc
            return bool(acked)
        await until(arrived, 10, "the arrival of b")
        await steps_until(snap, lambda: pg_barrier(postgres_url, prefix) == (2, ["a", "b"]),
                          "B with a and b", rounds=True)

        await restarted_on(own_redis, older, snap)
        for n, key in enumerate(arrivals_on_the_copy):  # (the copy's markers: accepted)
            assert await arrive(state, key, f"copy-{n}") == "skip"
        await steps_until(snap, lambda: partition in snap._lost_parts,
                          "the partition found behind", rounds=True)
        assert pg_barrier(postgres_url, prefix) == (2, ["a", "b"])
        report = (await status_report(settings))["store_lost"]
        assert f"partition {partition}'s {why}" in report and "behind" in report
        with pytest.raises(StateError) as refused:
            await arrive(state, "e", "refused")
        assert refused.value.code == "STORE_LOST"

        own_redis.client().flushall()
        await restore.restore(state, postgres_url)
        assert await arrive(state, "c", "after") == "skip"
        assert pg_barrier(postgres_url, prefix) == (2, ["a", "b"])
        fields = own_redis.client().hgetall(state.keys.barrier_partition("B").barrier("B"))
        assert sorted(k[1:].decode() for k in fields if k.startswith(b"a")) == ["a", "b", "c"]


async def test_an_older_copy_of_a_partition_s_barriers_is_found_behind(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """No entry written there since the copy: its stream looks current, its barrier write
    counter (1) is below B's `w` in PostgreSQL (2)."""
    await barrier_behind(own_redis, prefix, postgres_url, tmp_path / "older", [],
                         "barrier write counter is at 1, PostgreSQL holds a barrier written at 2")


async def test_an_arrival_on_an_older_copy_is_not_stored_over_the_newer_barrier(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """`c` arrives on the copy first: the barrier write counter is up to PostgreSQL's (2) and
    the copy's B at write 2 is not the B PostgreSQL holds at write 2; the snapshot's read
    counter tells first (the copy was made before the read that stored B at write 2; the
    first read counted is the first round's copy of the partition's barriers, 0063)."""
    await barrier_behind(own_redis, prefix, postgres_url, tmp_path / "older", ["c"],
                         "snapshot read counter is at 3, PostgreSQL holds a read counted at 4")


async def test_arrivals_on_an_older_copy_past_the_newer_barrier_s_write_are_found_behind(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """`c` and `d` arrive on the copy before the next round: its write counter (3) is past
    PostgreSQL's (2), and so is its B (write 3, other keys than PostgreSQL's B at write 2),
    which counters alone take for newer. The snapshot's own reads tell: the copy was made
    before the read PostgreSQL stored B from."""
    await barrier_behind(own_redis, prefix, postgres_url, tmp_path / "older", ["c", "d"],
                         "snapshot read counter is at")
