"""A state opened as a service opens it with the snapshot on (the repair at start first),
calls made as the service makes a bus call's, and what PostgreSQL holds: for tests that drive
a Snapshotter's steps themselves, to put a commit at a chosen moment; and for the kept
replies of step writes (decision 0061): what PostgreSQL's `sw_calls` holds, when nothing is
left unsaved, the kept-reply step run alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import psycopg
import redis

from stateworker.context import CallContext
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from stateworker.snapshot import kept, repair
from stateworker.snapshot.snapshotter import Snapshotter, connect
from stateworker.state import functions, lifecycle
from stateworker.state.core.store import RedisState
from tests.integration.snapshots import calls_saved


@asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[RedisState]:
    """The state as a service opens it: the repair at start first."""
    assert settings.postgres_url is not None
    pg = await connect(settings.postgres_url)

    async def before(state: RedisState) -> None:
        await repair.repair_at_start(state, pg)

    try:
        async with lifecycle.running(await lifecycle.connect(settings), reaper=False,
                                     before=before) as state:
            yield state
    finally:
        await pg.close()


async def bus_call(state: RedisState, fn: str, body: dict[str, Any], call_id: str) -> Any:
    """A call as the service runs a bus call's: its record kept (and sent to PostgreSQL)."""
    ctx = CallContext(call_id=call_id, call_digest="0" * 40)
    return await state.execute(functions.prepare(state, fn, msgspec.json.encode(body), ctx))


def snapshot_of(url: str, prefix: str) -> dict[tuple[str, str], tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT scope, key, value_text, version FROM sw_entries "
                            "WHERE prefix = %s", (prefix,)).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def arrival(barrier: str, key: str, expect: int = 2) -> dict[str, Any]:
    return {"event": {"key": key}, "condition_config": {"id": barrier, "expect": expect}}


def stored_calls(url: str, prefix: str) -> set[bytes]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT field FROM sw_calls WHERE prefix = %s", (prefix,)).fetchall()
    return {bytes(row[0]) for row in rows}


def nothing_unsaved(client: redis.Redis, keys: KeySpace) -> bool:
    """Every change, barrier and registry entry committed, and every kept reply with them."""
    last = client.xrevrange(keys.registry, "+", "-", count=1)
    return calls_saved(client, keys) and not any(
        client.xlen(p.unsaved_kept) or client.scard(p.barriers_changed)
        for p in keys.all_partitions()) and (
            not last or client.hget(keys.registry_snapshotted, "id") == last[0][0])


async def round_before_the_batch(snap: Snapshotter, home: int) -> None:
    """The snapshotter's kept-reply step for `home`, as its round runs it, before any batch
    or barrier store commits what the call wrote."""
    assert snap._pg is not None and snap.generation is not None
    await kept.store_covered(snap.state, snap._pg, snap.prefix, home, snap.generation)


def as_json(value: Any) -> Any:
    """A result as its JSON says (a Struct made by a run, or a replay's Raw)."""
    return msgspec.json.decode(msgspec.json.encode(value))
