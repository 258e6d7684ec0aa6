"""The byte bound of a partition's event history (STATEWORKER_EVENTS_MAX_BYTES): one caller
writing large values to one scope no longer grows its partition's stream until the count cap
(100,000 events of up to 2 MiB each, kept an hour for watches). Over the bound the dispatched
events go, oldest first, before the retention window ends; a watch behind them gets COMPACTED;
events still owed to triggers are never trimmed for bytes."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import Compacted
from stateworker.events.model import Event, revision_of
from stateworker.settings import Settings
from stateworker.state.api import StateStore
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
BOUND = 8 * MIB
VALUE = "x" * (512 * 1024)  # an event of two of them (old and new): about 1 MiB
WRITES = 48  # about 48 MiB of events: six times the bound


def settings_of(redis_server: RedisServer, prefix: str, **extra: object) -> Settings:
    return Settings(redis_url=redis_server.url, prefix=prefix, partitions=1,
                    events_max_bytes=BOUND, **extra)  # type: ignore[arg-type]


def stream_of(prefix: str) -> str:
    return f"{prefix}:{{{prefix}:p0}}:events"


async def write(store: StateStore, scope: str, count: int, value: str = VALUE) -> None:
    for n in range(count):  # one key: each event holds the value before and the one after
        await store.set(scope, "k", {"n": n, "v": value})


async def bounded(raw: aredis.Redis, prefix: str) -> bool:
    return int(await raw.memory_usage(stream_of(prefix), samples=0) or 0) <= BOUND


async def test_a_stream_over_the_byte_bound_keeps_its_newest_events_within_it(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    # (No trigger: every event is handed on at once. The retention window is an hour.)
    async with StateService.running(settings_of(redis_server, prefix),
                                    BusOptions(block_ms=50)) as service:
        store = StateStore(service.state)
        await write(store, scope, WRITES)
        await until(lambda: bounded(raw, prefix), 20, "the stream within events_max_bytes")
        kept = await store.events(scope)
    # The oldest went, the newest stayed, in order and none missing between.
    versions = [event.version for event in kept]
    assert versions == list(range(versions[0], WRITES + 1)) and versions[0] > 1
    assert 2 <= len(kept) <= BOUND // MIB, versions


async def test_a_watch_behind_the_byte_trim_is_compacted_and_one_after_it_reads_on(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    settings = settings_of(redis_server, prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=5) as client:
        store = StateStore(service.state)
        await write(store, scope, 1)
        (first,) = await store.events(scope)
        await write(store, scope, WRITES)
        await until(lambda: bounded(raw, prefix), 20, "the stream within events_max_bytes")
        with pytest.raises(Compacted) as caught:
            async with client.watch(scope, None, first.revision) as watch:
                await anext(watch)
        oldest = caught.value.details["oldest_kept"]
        assert caught.value.details["reason"] == "trimmed"
        assert revision_of(oldest) > revision_of(first.revision)
        kept = await store.events(scope)
        assert kept[0].revision == oldest
        async with client.watch(scope, None, oldest) as watch:
            after = [await anext(watch) for _ in kept[1:]]
        assert [(e.revision, e.version) for e in after if isinstance(e, Event)] == [
            (e.revision, e.version) for e in kept[1:]]


async def test_events_owed_to_a_trigger_are_never_trimmed_for_bytes(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """Triggers paused: the stream grows past the bound (its events are owed), every one is
    handed on once they run again, and then the stream is trimmed within the bound."""
    value, writes = "y" * (256 * 1024), 24  # 12 MiB of events: 1.5 times the bound
    paused = settings_of(redis_server, prefix, triggers_enabled=False)
    async with StateService.running(paused, BusOptions(block_ms=50)) as service:
        store = StateStore(service.state)
        await store.call("state::register-trigger", {
            "id": "all", "function_id": "reactor::on_change", "service": "reactor"})
        await write(store, scope, writes, value)
        assert not await bounded(raw, prefix)
        written = await raw.zscore(service.state.keys.replicas, service.dispatcher.replica) \
            if service.dispatcher else None
        assert written is not None

        async def two_rounds_later() -> bool:  # (each round beats, renews and trims)
            beat = await raw.zscore(service.state.keys.replicas, service.dispatcher.replica) \
                if service.dispatcher else None
            return beat is not None and beat >= written + 2000

        await until(two_rounds_later, 20, "two of the dispatcher's rounds after the writes")
        assert len(await store.events(scope)) == writes
    async with StateService.running(settings_of(redis_server, prefix),
                                    BusOptions(block_ms=50)), \
            Handler(settings_of(redis_server, prefix)).running() as handler:
        await until(lambda: len(handler.calls) >= writes, 30, "every event handed on")
        await until(lambda: bounded(raw, prefix), 20, "the stream within events_max_bytes")
    assert sorted(body["version"] for _, body in handler.calls) == list(range(1, writes + 1))
