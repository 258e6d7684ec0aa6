"""Leases lost together are said in one line, and again at most once a window: a busy or full
Redis lets every lease of a replica lapse at once, round after round (test_out_of_memory saw
one line per partition, over and over)."""

from __future__ import annotations

import logging

import pytest

from stateworker.reactive.leases import Leases
from stateworker.state.api import StateStore
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_every_lease_lost_at_once_is_one_line(
        redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               reaper=False) as store:
        leases = Leases(store.state, "mine")
        names = [store.state.keys.partition(p).lease for p in range(4)]
        with caplog.at_level(logging.WARNING, logger="stateworker"):
            for _ in range(3):  # all four taken, then all four lost, three times running
                await store.state.conn.execute("DEL", *names)
                await leases.round()
                assert leases.held == {0, 1, 2, 3}
                for name in names:  # (another replica's now)
                    await store.state.conn.execute("SET", name, "theirs")
                await leases.round()
                assert leases.held == set()
        lines = [r for r in caplog.records if getattr(r, "event", "") == "dispatch.lease_lost"]
        assert len(lines) == 1 and getattr(lines[0], "partitions", None) == [0, 1, 2, 3]
