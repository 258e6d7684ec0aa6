"""A Redis restarted on an older copy of its data whose registry then takes a change of its
own before the snapshotter's next round: the registry stream's entries-added (all the
registry copy checked, `sw_generations.registry_n`) catches up with PostgreSQL's, so the
copy's registry looked current and replaced the newer one PostgreSQL held (a trigger
registered after the copy was made was deleted from `sw_triggers`, and a restore from it
would have lost it). The registry's own snapshot read counter tells: the copy was made
before the read PostgreSQL copied the newer registry from (snapshot/behind.py)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import psycopg
import pytest

from stateworker import StateError
from stateworker.app.cli import status_report
from stateworker.snapshot.snapshotter import Snapshotter
from stateworker.state import generation
from stateworker.state.core.store import RedisState
from tests.integration.busproto import until
from tests.integration.snapshot.driven import bus_call as call
from tests.integration.snapshot.driven import opened
from tests.integration.snapshot.test_lost_redis import swap_data
from tests.integration.snapshot.test_older_copy_between_rounds import restarted_on, stepped, steps_until
from tests.integration.snapshot.test_repair import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def pg_triggers(url: str, prefix: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id FROM sw_triggers WHERE prefix = %s ORDER BY id",
                            (prefix,)).fetchall()
    return [str(r[0]) for r in rows]


def trigger(name: str) -> dict[str, str]:
    return {"id": name, "function_id": "reactor::on_change", "service": "reactor"}


async def registered(state: RedisState, name: str, call_id: str) -> bool:
    """`name` registered (False: UNAVAILABLE, while the state's connection still meets the
    old socket of a restarted Redis)."""
    try:
        await call(state, "state::register-trigger", trigger(name), call_id)
    except StateError as exc:
        assert exc.code == "UNAVAILABLE", exc
        return False
    return True


async def copied_then_t2(own_redis: RedisServer, older: Path, state: RedisState,
                         snap: Snapshotter, postgres_url: str, prefix: str) -> None:
    """t1 registered and copied to PostgreSQL, Redis's data copied to `older` (a clean stop:
    a complete AOF), then t2 registered and copied too: `older` lacks t2."""
    await call(state, "state::register-trigger", trigger("t1"), "r1")
    await steps_until(snap, lambda: pg_triggers(postgres_url, prefix) == ["t1"],
                      "t1 copied", rounds=True)
    own_redis.kill(signal.SIGTERM)
    shutil.copytree(own_redis.directory, older)
    own_redis.start()
    await restarted_on(own_redis, None, snap)
    await until(lambda: registered(state, "t2", "r2"), 10, "t2 registered")
    await steps_until(snap, lambda: pg_triggers(postgres_url, prefix) == ["t1", "t2"],
                      "t2 copied", rounds=True)


async def test_a_registry_change_on_an_older_copy_is_not_copied_over_the_newer_registry(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    older = tmp_path / "older"
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await copied_then_t2(own_redis, older, state, snap, postgres_url, prefix)

        await restarted_on(own_redis, older, snap)
        # The copy has the same markers: it takes a registration, and its registry stream's
        # entries-added is PostgreSQL's count again.
        await until(lambda: registered(state, "t3", "r3"), 10, "t3 registered on the copy")
        await steps_until(snap, lambda: not snap._registry_ok or "t3" in pg_triggers(
            postgres_url, prefix), "the registry found behind (or the copy's copied)",
                          rounds=True)
        assert pg_triggers(postgres_url, prefix) == ["t1", "t2"]
        markers = await generation.read(state.conn, state.keys)
        assert markers.registry is None  # (its writes refused from now on)
        assert "the generation marker of the registry is gone" in \
            (await status_report(settings))["store_lost"]
        assert snap._lost is not None
        assert ("the registry's snapshot read counter is at 1, PostgreSQL holds a copy counted "
                "at 2" in snap._lost) and "behind the snapshot" in snap._lost
        with pytest.raises(StateError) as refused:
            await call(state, "state::register-trigger", trigger("t4"), "r4")
        assert refused.value.code == "STORE_LOST"


async def test_the_repair_at_start_restores_an_older_copy_of_the_registry(
        own_redis: RedisServer, prefix: str, postgres_url: str, tmp_path: Path) -> None:
    """Started on a copy from before t2's registration was copied (no entry anywhere, so its
    streams and barriers look current): the repair at start finds the registry behind and
    restores it, t2 back, instead of serving the copy's registry."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    older = tmp_path / "older"
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await copied_then_t2(own_redis, older, state, snap, postgres_url, prefix)
    swap_data(own_redis, older)
    async with opened(settings) as state:
        assert sorted(k.decode() for k in await state.conn.execute(
            "HKEYS", state.keys.triggers)) == ["t1", "t2"]
        markers = await generation.read(state.conn, state.keys)
        assert markers.problem() is None
