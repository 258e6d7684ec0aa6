"""What the tests of the bus on a Redis of its own share (STATEWORKER_BUS_REDIS_URL): a strict
state Redis (`appendfsync always`) and a bus Redis that fsyncs once a second, each the test's
own (some tests kill and wipe one), and the settings that join them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import pytest

from stateworker import StateStore
from stateworker.bus.client import StateClient
from stateworker.errors import StateError
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer


class Pair(NamedTuple):
    state: RedisServer
    bus: RedisServer

    def settings(self, prefix: str, **extra: Any) -> Settings:
        return Settings(**{"redis_url": self.state.url, "bus_redis_url": self.bus.url,
                           "prefix": prefix, "partitions": 4, "durability": "strict", **extra})


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    state = RedisServer(tmp_path / "state", appendfsync="always")
    bus = RedisServer(tmp_path / "bus", appendfsync="everysec")
    try:
        state.start()
        bus.start()
        yield Pair(state, bus)
    finally:
        state.kill()
        bus.kill()


async def flood_until(client: StateClient, scope: str, writers: int, enough: int,
                      fault: Callable[[], None]) -> list[int]:
    """`writers` tasks, each setting its key `k<w>` to 1, 2, 3 ... until a write fails (its
    outcome unknown); `fault()` once `enough` writes were acknowledged. The last value each
    writer got a reply for."""
    acked = [0] * writers

    async def writer(w: int) -> None:
        value = 0
        while True:
            value += 1
            try:
                await client.set(scope, f"k{w}", value)
            except StateError:
                return
            acked[w] = value

    async with anyio.create_task_group() as tg:
        for w in range(writers):
            tg.start_soon(writer, w)
        await until(lambda: sum(acked) >= enough, 60, "writes before the fault")
        fault()
    return acked


async def assert_kept(state: RedisServer, prefix: str, scope: str, acked: list[int]) -> None:
    """The state's Redis (restarted on its AOF) holds every acknowledged write: each key its
    last acknowledged value, or the next one (the write in flight at the fault)."""
    async with StateStore.open(state.url, prefix=prefix, partitions=4, reaper=False,
                               durability="strict") as store:
        for w, value in enumerate(acked):
            stored = (await store.get(scope, f"k{w}")) or 0
            assert stored in (value, value + 1), (w, stored, value)
