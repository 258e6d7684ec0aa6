"""A state opened as a service opens it with the snapshot on (the repair at start first),
calls made as the service makes a bus call's, and what PostgreSQL holds: for tests that drive
a Snapshotter's steps themselves, to put a commit at a chosen moment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import psycopg

from stateworker.context import CallContext
from stateworker.settings import Settings
from stateworker.snapshot import repair
from stateworker.snapshot.snapshotter import connect
from stateworker.state import functions, lifecycle
from stateworker.state.core.store import RedisState


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
