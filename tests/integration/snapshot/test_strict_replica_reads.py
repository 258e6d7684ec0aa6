"""`strict` with a replica (STATEWORKER_STRICT_REPLICAS=1): every acknowledged write is on
the replica before its reply, so promoting it loses none. The snapshot's read counter must
hold to the same rule: a count committed to PostgreSQL but not yet on the replica made the
promoted replica, which held every acknowledged write and every row PostgreSQL held, look
like an older copy (its counter one below PostgreSQL's), and the service refused to start
on it (snapshot/behind.py). Now a read's count is confirmed as a strict batch is before the
snapshot commits it.

Servers of their own: a primary and its replica, `appendfsync always`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state import generation
from stateworker.state.core.store import RedisState
from tests.integration.snapshot.driven import bus_call as call
from tests.integration.snapshot.driven import opened
from tests.integration.snapshot.test_older_copy_between_rounds import stepped
from tests.integration.snapshot.test_repair import settings_for
from tests.integration.snapshots import postgres_entries
from tests.servers import RedisServer, primary_with_replica

pytestmark = pytest.mark.anyio


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    with primary_with_replica(tmp_path) as servers:
        yield servers


async def steps(snap: Snapshotter, holds: Any, count: int) -> bool:
    """Up to `count` snapshot steps as its loop runs them (a round at each, an error handed
    to `_step_failed`), until `holds()`; whether it did."""
    for _ in range(count):
        snap._last_round = 0.0
        try:
            await snap._step()
        except Exception as exc:  # (the loop answers any error so)
            await snap._step_failed(exc)
        if holds():
            return True
    return False


async def test_a_replica_promoted_in_strict_mode_is_not_found_behind(
        pair: tuple[RedisServer, RedisServer], prefix: str, postgres_url: str) -> None:
    primary, replica = pair
    strict = settings_for(primary.url, prefix, postgres_url, durability="strict",
                          strict_replicas=1)

    def version(n: int) -> Any:
        return lambda: postgres_entries(postgres_url, prefix).get(("s", "k"), ())[:2] == \
            (str(n), n)

    async def write(state: RedisState, value: int, call_id: str) -> int:
        return int((await call(state, "state::set", {"scope": "s", "key": "k", "value": value},
                               call_id)).version)

    async with opened(strict) as state, stepped(state, postgres_url) as snap:
        assert await write(state, 1, "c1") == 1
        assert await steps(snap, version(1), 20), "version 1 in PostgreSQL"
        assert await write(state, 2, "c2") == 2  # (acknowledged: on the replica)
        # The replica is cut off: every acknowledged write is on it. What the snapshot
        # reads of version 2 from now on is counted on the primary alone.
        replica.client().execute_command("REPLICAOF", "NO", "ONE")
        assert not await steps(snap, version(2), 1)  # (not committed: not on the replica)
        error = await state.conn.execute("HGET", state.keys.snapshot_status, "last_error")
        assert b"the snapshot's read count is not confirmed" in error, error
        assert b"0 of 1 replicas" in error, error
    primary.kill(signal.SIGKILL)  # the failover: the replica serves from now on

    promoted = settings_for(replica.url, prefix, postgres_url, durability="strict",
                            strict_replicas=0)
    async with opened(promoted) as state, stepped(state, postgres_url) as snap:
        assert await write(state, 3, "c3") == 3
        assert await steps(snap, version(3), 20), "version 3 in PostgreSQL"


async def test_kill_9_of_a_strict_redis_loses_no_count(tmp_path: Path, prefix: str,
                                                        postgres_url: str) -> None:
    """`appendfsync always`: a count is fsynced before its reply, so before PostgreSQL commits
    it; Redis killed right after the commits is found whole at start (no repair, no refusal)
    and the snapshot goes on."""
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    try:
        settings = settings_for(server.url, prefix, postgres_url, durability="strict")
        async with opened(settings) as state, stepped(state, postgres_url) as snap:
            for n in range(1, 6):
                assert int((await call(state, "state::set", {"scope": "s", "key": "k",
                                                              "value": n}, f"c{n}")).version) == n
                await call(state, "state::barrier", {"event": {"key": f"a{n}"},
                                                     "condition_config": {"id": "B",
                                                                          "expect": 9}},
                           f"b{n}")
                assert await steps(snap, lambda n=n: postgres_entries(postgres_url, prefix).get(
                    ("s", "k"), ())[:2] == (str(n), n), 20)
            assert snap.reads and all(count > 0 for count in snap.reads.values())
            before = (await generation.read(state.conn, state.keys)).meta
        server.kill(signal.SIGKILL)
        server.start()
        async with opened(settings) as state, stepped(state, postgres_url) as snap:
            markers = await generation.read(state.conn, state.keys)
            assert markers.problem() is None and markers.meta == before  # (not restored)
            assert int((await call(state, "state::set", {"scope": "s", "key": "k",
                                                          "value": 6}, "c6")).version) == 6
            assert await steps(snap, lambda: postgres_entries(postgres_url, prefix).get(
                ("s", "k"), ())[:2] == ("6", 6), 20)
            assert not snap._lost_parts and snap._lost is None
    finally:
        server.kill()
