"""A restore that stops in its last step: every slot stamped with its generation (writes are
let in there) but the meta hash not yet (its `restoring` still set). The service takes writes
from then on and acknowledges them; the restore is then run again (as its failure says), or
the service restarts (the repair at start). Neither may restore over what was acknowledged
since: the restore's data was whole, so it is finished, not done again, and the snapshot
commits the writes it missed."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.snapshot import restore as restoring
from stateworker.snapshot.generation import restore_unlock, try_restore_lock
from stateworker.snapshot.snapshotter import connect
from stateworker.state import generation, lifecycle
from stateworker.transport.wire import ConnectionLost
from tests.integration.busproto import until
from tests.integration.snapshots import caught_up, postgres_entries
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

PARTITIONS = 4


def stopped_before_the_meta_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore's process dies (or loses Redis) once `stamp` stamped every slot."""
    checked = generation.checked_pipeline

    async def dies(conn: Any, commands: list[list[Any]], what: str) -> list[Any]:
        if what == "restore: stamp":
            raise ConnectionLost("the restore was killed")
        return await checked(conn, commands, what)

    monkeypatch.setattr(generation, "checked_pipeline", dies)


@pytest.mark.parametrize("then", ["left", "restored again", "restarted"])
async def test_a_restore_stopped_while_stamping_never_undoes_a_write_acknowledged_since(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        monkeypatch: pytest.MonkeyPatch, then: str) -> None:
    """`left`: nobody runs it again, the running snapshotter finishes it. The others hold the
    restore's lock on (as the next restore would: that snapshotter leaves it to them): the
    restore run again while the service runs, or the service restarted (the repair at
    start, once the lock is let go)."""
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=PARTITIONS,
                        postgres_url=postgres_url, lease_ms=1000)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    lock = await connect(postgres_url)
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
                StateStore.open(settings=settings) as store:
            await store.set("s", "k", "old")
            await until(lambda: caught_up(client, keys), 30, "the snapshot")
            client.flushall()
            assert await try_restore_lock(lock, prefix)
            with monkeypatch.context() as patched:
                stopped_before_the_meta_hash(patched)
                async with lifecycle.open_state(settings=settings, reaper=False) as state:
                    with pytest.raises(ConnectionLost):
                        await restoring.restore(state, postgres_url, pg=lock, locked=True)
            if then == "left":  # (its process is gone, and its lock with it)
                await restore_unlock(lock, prefix)
            await until(lambda: service.state.lost is None, 30, "writes let in")
            written = await store.set("s", "k", "acknowledged")
            created = await store.set("s", "new", "acknowledged")
            assert (written.version, created.version) == (2, 1)
            if then == "left":  # (the writes reach PostgreSQL all the same)
                await until(lambda: postgres_entries(postgres_url, prefix).get(("s", "new")),
                            30, "the writes since in PostgreSQL")
            if then == "restored again":  # (as its failure said, the service still running)
                async with lifecycle.open_state(settings=settings, reaper=False) as state:
                    summary = await restoring.restore(state, postgres_url, pg=lock, locked=True)
                assert summary.finished and summary.entries == 0
        if then != "left":
            await restore_unlock(lock, prefix)
    finally:
        await lock.close()
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateStore.open(settings=settings) as store:
        await until(lambda: service.state.lost is None, 30, "writes let in")
        assert (await store.get_entry("s", "k")).version == 2
        assert await store.get("s", "k") == "acknowledged"
        assert await store.get("s", "new") == "acknowledged"
        await until(lambda: caught_up(client, keys), 30, "the snapshot")
        assert {k: v[:2] for k, v in postgres_entries(postgres_url, prefix).items()} == {
            ("s", "k"): ('"acknowledged"', 2), ("s", "new"): ('"acknowledged"', 1)}
        markers = await generation.read(service.state.conn, service.state.keys)
        assert markers.restoring is None and markers.agree(markers.meta or "")
