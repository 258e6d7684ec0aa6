"""A prefix's partition count is claimed once (decision 0073): two processes opening a new
prefix at once with other counts, or a restart with another count, are refused with
LAYOUT_MISMATCH naming STATEWORKER_PARTITIONS, the count stored and the one given.

Found by attack: two stores opened a new prefix at once with 4 and 8 partitions; both
checked `<prefix>:meta` before either wrote it, both opened, and each wrote its scopes in
its own layout (meta said 4: the 8-partition store's writes were in partitions the others
never read)."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, LayoutMismatch
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_two_opened_at_once_with_other_counts_one_is_refused(
        redis_server: RedisServer, prefix: str) -> None:
    opened: dict[int, object] = {}
    refused: dict[int, LayoutMismatch] = {}

    async def open_with(partitions: int) -> None:
        try:
            async with StateStore.open(redis_server.url, prefix=prefix, partitions=partitions,
                                       reaper=False) as store:
                # Both past the check before either writes: a store that opened writes in
                # its layout.
                await store.set(f"s{partitions}", "k", partitions)
                opened[partitions] = await store.get(f"s{partitions}", "k")
        except LayoutMismatch as exc:
            refused[partitions] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(open_with, 4)
        tg.start_soon(open_with, 8)
    raw = redis_server.client()
    stored = int(raw.hget(f"{prefix}:meta", "partitions"))
    assert set(opened) == {stored} and set(refused) == {12 - stored}
    exc = refused[12 - stored]
    assert exc.code == "LAYOUT_MISMATCH" and isinstance(exc, ConfigError)
    assert exc.details == {"setting": "partitions", "stored": stored, "given": 12 - stored,
                           "prefix": prefix}
    assert "STATEWORKER_PARTITIONS" in exc.message
    # The refused one left no history hash past the prefix's count (no partition's).
    assert not [n for n in range(stored, 8)
                if raw.exists(KeySpace(prefix, 8).partition(n).history)]


async def test_a_restart_with_another_count_is_refused_by_the_command(
        redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store:
        await store.set("s", "k", 1)
    env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "8"}
    serve = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url",
                            redis_server.url, "serve"], env=env, capture_output=True,
                           text=True, timeout=60, check=False)
    assert serve.returncode == 2
    assert (f'\nstateworker: LAYOUT_MISMATCH: prefix "{prefix}" was created with 4 '
            "partitions, not 8") in serve.stderr, serve.stderr
    assert "STATEWORKER_PARTITIONS=4" in serve.stderr
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as store:
        assert await store.get("s", "k") == 1


async def test_a_client_with_another_count_is_served_in_the_services_layout(
        redis_server: RedisServer, prefix: str) -> None:
    """A `StateClient` opens no prefix: its count only picks a shard (an order), and the
    service places each call by its own count."""
    served = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4, bus_shards=2)
    other = msgspec.structs.replace(served, partitions=16)
    async with StateService.running(served, BusOptions(block_ms=50)), \
            StateClient(settings=other, timeout=10) as client, \
            StateStore.open(settings=served, reaper=False) as store:
        for n in range(20):
            await client.set(f"s{n}", "k", n)
        assert [await store.get(f"s{n}", "k") for n in range(20)] == list(range(20))
        body = {"scope": "s1", "key": "n", "ops": [{"type": "increment", "path": "c", "by": 1}]}
        first = await client.call("state::update", body, call_id="once")
        assert await client.call("state::update", body, call_id="once") == first
        assert await store.get("s1", "n") == {"c": 1}
