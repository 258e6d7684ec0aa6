"""What the tests of the bus on a Redis of its own share (STATEWORKER_BUS_REDIS_URL): a strict
state Redis (`appendfsync always`) and a bus Redis that fsyncs once a second, each the test's
own (some tests kill and wipe one), and the settings that join them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from stateworker.settings import Settings
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
