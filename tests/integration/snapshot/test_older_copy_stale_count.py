"""A snapshotter whose idea of PostgreSQL's read count is old (it lost a partition's lease
while paused, and the new holder committed reads since) reading a Redis restarted on an
older copy: the copy's counter is the one it remembers, so `snapread.lua` counted its read,
and the commit put the copy's write over the newer row PostgreSQL held (the new holder's
count, higher, stayed, so the partition was found behind only afterwards). The commit now
checks the count against PostgreSQL's in its own transaction: a count not above it is
Fenced, nothing committed (snapshot/behind.py)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import anyio
import pytest

from stateworker.keys import KeySpace
from stateworker.snapshot.generation import Fenced
from tests.integration.snapshot.driven import opened
from tests.integration.snapshot.test_older_copy_between_rounds import (
    restarted_on,
    stepped,
    steps_until,
    written,
)
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshots import postgres_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_stale_count_on_an_older_copy_commits_nothing(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    partition = KeySpace(prefix, PARTITIONS).partition_of("s")
    older = tmp_path / "older"

    def pg_value() -> tuple[object, ...]:
        return postgres_entries(postgres_url, prefix).get(("s", "k"), ())[:2]

    async with opened(settings) as state, stepped(state, postgres_url) as a:
        assert await written(state, 1, "c1") == 1
        await steps_until(a, lambda: pg_value() == ("1", 1), "version 1 (by A)")
        assert partition in a.positions
        own_redis.kill(signal.SIGTERM)  # (the copy: made after A's last count)
        shutil.copytree(own_redis.directory, older)
        own_redis.start()
        await restarted_on(own_redis, None, a)

        # A pauses past its lease of the partition (its lease gone), B takes it over and
        # commits version 2; A still holds the partition's position and count in memory.
        await state.conn.execute("DEL", state.keys.partition(partition).snapshot_lease)
        async with stepped(state, postgres_url) as b:
            assert await written(state, 2, "c2") == 2
            await steps_until(b, lambda: pg_value() == ("2", 2), "version 2 (by B)",
                              rounds=True)
            assert partition in b.leases.held
            truth = postgres_entries(postgres_url, prefix)

            await restarted_on(own_redis, older, a)
            assert await written(state, "stale", "c3") == 2  # (the copy's version 1, then 2)
            a._last_round = anyio.current_time()  # (A between two rounds)
            raised: list[Fenced] = []
            try:
                await a._step()
            except Fenced as exc:
                raised.append(exc)
            # Not ('"stale"', 2): the copy's write over the version 2 B committed.
            assert postgres_entries(postgres_url, prefix) == truth
            assert raised and f"partition {partition}'s snapshot read count" in \
                raised[0].message
