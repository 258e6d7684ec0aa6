"""Durability modes: `strict` replies only after the write is in the AOF (and survives a kill -9
of redis-server), refuses a Redis that does not fsync every write, and says how it keeps its
promise in the start line; `fast` is the everysec default."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import CallTimeout, ConfigError, StateError, Unavailable
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

WRITERS = 64
ACKED_BEFORE_KILL = 3000  # acknowledged writes (all keys) before redis-server is killed


async def test_strict_kill_9_of_redis_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """64 tasks each write 1, 2, 3 ... to their own key through one StateStore (the reply a
    store gets is Redis's reply to the write itself: nothing between them retries, queues or
    answers for Redis); redis-server is killed -9 mid-flight and restarted on its AOF."""
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    acked = [0] * WRITERS  # the last value each writer got a successful reply for
    in_flight: list[int | None] = [None] * WRITERS  # the value it was waiting for at the kill
    try:
        async with StateStore.open(server.url, prefix="dur", partitions=4, reaper=False,
                                   durability="strict", connect_timeout_s=1.0) as store:
            async def writer(w: int) -> None:
                value = 0
                while True:
                    value += 1
                    in_flight[w] = value
                    try:
                        await store.set("dur", f"k{w}", value)
                    except StateError:  # Redis gone: this write's outcome is unknown
                        return
                    acked[w], in_flight[w] = value, None

            async with anyio.create_task_group() as tg:
                for w in range(WRITERS):
                    tg.start_soon(writer, w)
                await until(lambda: sum(acked) >= ACKED_BEFORE_KILL, 60, "writes before the kill")
                server.kill()  # SIGKILL: no shutdown, no final fsync
    finally:
        server.kill()

    # Every writer was waiting for exactly one reply when Redis died.
    assert all(value is not None for value in in_flight), in_flight
    stored, events = await after_restart(tmp_path, "dur", WRITERS)
    for w in range(WRITERS):
        # Every acknowledged write is there; of the one in flight, it was applied or not.
        assert stored[w] in (acked[w], in_flight[w]), (w, stored[w], acked[w], in_flight[w])
    applied_in_flight = sum(stored[w] == in_flight[w] for w in range(WRITERS))
    assert sum(stored) == sum(acked) + applied_in_flight
    assert len(events) == sum(stored)  # one event per applied write, none lost, none extra
    assert sum(acked) >= ACKED_BEFORE_KILL


async def after_restart(tmp_path: Path, prefix: str, writers: int) -> tuple[list[Any], list[Any]]:
    """Redis restarted on the AOF the killed server left: each writer's value (0: none) and
    the events of scope `dur`. Each write applied once: the version counts the values."""
    restarted = RedisServer(tmp_path / "redis", appendfsync="always")
    restarted.start()
    try:
        async with StateStore.open(restarted.url, prefix=prefix, partitions=4, reaper=False,
                                   durability="strict") as store:
            stored = []
            for w in range(writers):
                entry = await store.get_entry("dur", f"k{w}", default=None)
                stored.append(0 if entry is None else entry.value)
                assert entry is None or entry.version == entry.value
            return stored, await store.events("dur")
    finally:
        restarted.kill()


BUS_WRITERS = 32
BUS_ACKED_BEFORE_KILL = 1500


async def test_strict_kill_9_of_redis_under_32_bus_writers_keeps_every_acknowledged_write(
        tmp_path: Path) -> None:
    """The same over the bus: 32 callers each write 1, 2, 3 ... to their own key through a
    `stateworker serve` process in `strict`; redis-server is killed -9 with calls in flight.
    Every reply a caller got before the kill names a write the restarted Redis holds."""
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    service = ServiceProcess(server.url, "durbus", env={"STATEWORKER_DURABILITY": "strict"})
    acked = [0] * BUS_WRITERS  # the last value each caller got a successful reply for
    in_flight: list[int | None] = [None] * BUS_WRITERS  # the value it waited for at the kill
    try:
        service.start()
        settings = Settings(redis_url=server.url, prefix="durbus", partitions=4)
        async with StateClient(settings=settings, timeout=3.0) as client:
            async def writer(w: int) -> None:
                value = 0
                while True:
                    value += 1
                    in_flight[w] = value
                    try:
                        await client.call("state::set", {"scope": "dur", "key": f"k{w}",
                                                         "value": value})
                    except StateError:  # Redis gone: this call's outcome is unknown
                        return
                    acked[w], in_flight[w] = value, None

            async with anyio.create_task_group() as tg:
                for w in range(BUS_WRITERS):
                    tg.start_soon(writer, w)
                await until(lambda: sum(acked) >= BUS_ACKED_BEFORE_KILL, 60,
                            "writes before the kill")
                server.kill()  # SIGKILL: no shutdown, no final fsync
    finally:
        service.kill()
        server.kill()
    # (A reply read just after the kill was pushed before it: every one counted in `acked`
    # came from the killed server, which had fsynced its write before the service replied.)
    assert all(value is not None for value in in_flight), in_flight
    stored, events = await after_restart(tmp_path, "durbus", BUS_WRITERS)
    for w in range(BUS_WRITERS):
        assert stored[w] in (acked[w], in_flight[w]), (w, stored[w], acked[w], in_flight[w])
    assert len(events) == sum(stored)
    assert sum(acked) >= BUS_ACKED_BEFORE_KILL


async def test_strict_refuses_an_external_redis_without_appendfsync_always(
        own_redis: RedisServer) -> None:
    with pytest.raises(ConfigError) as refused:
        async with StateStore.open(own_redis.url, durability="strict"):
            pass
    message = str(refused.value)
    assert "STATEWORKER_DURABILITY=strict" in message
    assert 'appendfsync is "everysec"' in message
    assert "CONFIG SET appendfsync always" in message and "STATEWORKER_DURABILITY=fast" in message
    async with StateStore.open(own_redis.url) as store:  # fast (the default) accepts it
        await store.set("s", "k", 1)


async def test_strict_says_so_when_redis_refuses_config(own_redis: RedisServer) -> None:
    with own_redis.client() as admin:
        admin.config_set("appendfsync", "always")
        admin.execute_command("ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all",
                              "-config")
    url = f"redis://app:secret@127.0.0.1:{own_redis.port}/0"
    with pytest.raises(ConfigError) as refused:
        async with StateStore.open(url, durability="strict"):
            pass
    message = str(refused.value)
    assert "refused CONFIG GET appendfsync" in message and "NOPERM" in message
    assert "STATEWORKER_DURABILITY=fast" in message


async def test_strict_start_line_names_how_replies_wait_for_the_disk(
        own_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    with own_redis.client() as admin:
        admin.config_set("appendfsync", "always")
        version = tuple(int(part) for part in admin.info("server")["redis_version"].split("."))
    caplog.set_level(logging.INFO, logger="stateworker")
    settings = Settings(redis_url=own_redis.url, prefix="dur", durability="strict")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        assert service.state.waitaof == (version >= (7, 2))
    started = [r for r in caplog.records if r.getMessage() == "serving"]
    assert len(started) == 1
    expected = "appendfsync always + WAITAOF 1 0" if version >= (7, 2) else "appendfsync always"
    assert (getattr(started[0], "durability", None), getattr(started[0], "fsync", None)) == (
        "strict", expected)


async def test_embedded_redis_fsyncs_as_the_mode_says(tmp_path: Path) -> None:
    always, everysec = [b"appendfsync", b"always"], [b"appendfsync", b"everysec"]
    async with StateStore.open(state_dir=str(tmp_path), durability="strict") as strict:
        assert await strict.state.conn.execute("CONFIG", "GET", "appendfsync") == always
    async with StateStore.open(state_dir=str(tmp_path)) as fast:
        assert await fast.state.conn.execute("CONFIG", "GET", "appendfsync") == everysec
        # A strict store adopting the running embedded Redis makes it fsync every write.
        async with StateStore.open(state_dir=str(tmp_path), durability="strict") as strict:
            assert await strict.state.conn.execute("CONFIG", "GET", "appendfsync") == always


@pytest.mark.parametrize(("env", "problem"), [
    ({"STATEWORKER_DURABILITY": "safe"}, "durability must be one of ('fast', 'strict')"),
    ({"STATEWORKER_APPENDFSYNC": "always"}, "STATEWORKER_APPENDFSYNC is replaced by "
                                            "STATEWORKER_DURABILITY"),
    ({"STATEWORKER_DURABILITY": "strict", "STATEWORKER_ALLOW_NO_AOF": "true"},
     "durability strict needs AOF"),
])
def test_durability_settings_are_checked(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_durability_modes_ask_for_their_fsync() -> None:
    assert Settings.from_env({}).appendfsync == "everysec"
    assert Settings.from_env({"STATEWORKER_DURABILITY": "strict"}).appendfsync == "always"


async def test_strict_answers_unavailable_when_redis_does_not_confirm_the_fsync(
        own_redis: RedisServer) -> None:
    """Where the server has WAITAOF, a batch's results wait for its confirmation; a batch it
    does not confirm (here: a Redis 7.0 asked for WAITAOF anyway, so it answers with an error,
    as a 7.2 with AOF turned off does) is answered UNAVAILABLE and nothing hangs."""
    admin = own_redis.client()
    admin.config_set("appendfsync", "always")
    async with StateStore.open(own_redis.url, durability="strict") as store:
        await store.set("s", "k", 1)
        if store.state.waitaof:  # Redis 7.2+: WAITAOF with AOF off is an error
            admin.config_set("appendonly", "no")
        else:  # Redis 7.0 (this machine): WAITAOF itself is unknown
            store.state.waitaof = True
        with anyio.fail_after(10), pytest.raises(Unavailable, match="did not confirm the write"):
            await store.set("s", "k", 2)
    admin.close()


async def test_strict_over_the_bus_replies_only_after_the_confirmation(
        own_redis: RedisServer) -> None:
    """The service's batch holds its replies until the AOF confirmation: a call whose batch
    is not confirmed gets no reply (it stays pending and is served again), so its caller sees
    TIMEOUT, never a success; once confirmations come back, the next call is answered."""
    with own_redis.client() as admin:
        admin.config_set("appendfsync", "always")
        settings = Settings(redis_url=own_redis.url, prefix="dur", durability="strict")
        async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
                StateClient(settings=settings) as client:
            await client.call_json("state::set", b'{"scope":"s","key":"k","value":1}')
            has_waitaof = service.state.waitaof
            if has_waitaof:  # Redis 7.2+: WAITAOF with AOF off is an error
                admin.config_set("appendonly", "no")
            else:  # Redis 7.0 (this machine): WAITAOF itself is unknown
                service.state.waitaof = True
            with pytest.raises(CallTimeout):
                await client.call_json("state::set", b'{"scope":"s","key":"k","value":2}',
                                       timeout=1.0)
            if has_waitaof:
                admin.config_set("appendonly", "yes")
            else:
                service.state.waitaof = False
            reply = await client.call_json("state::get-entry", b'{"scope":"s","key":"k"}')
            assert b'"value":2' in reply and b'"version":2' in reply
