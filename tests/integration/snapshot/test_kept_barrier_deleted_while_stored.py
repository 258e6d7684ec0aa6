"""A barrier deleted while the snapshot stores it (snapshot/barriers.py: read, committed, then
forgotten by forget.lua if unchanged since the read).

forget.lua took an absent hash for "nothing left to store", also when the hash read was
present: a deletion between the read and the forget lost its mark, so PostgreSQL kept the
barrier; and the kept reply of that delete-barrier (decision 0061), its mark gone, went to
PostgreSQL without the deletion. After a restore its retry answered {deleted: true} and the
barrier was back. The commit is held here by a row lock in PostgreSQL until the deletion is
made. (PostgreSQL holds an entry too: the repair at start restores only a prefix it holds
something of besides call records.)"""

from __future__ import annotations

import anyio
import psycopg
import pytest

from stateworker.keys import KeySpace, call_field
from stateworker.snapshot import barriers
from tests.integration.busproto import until
from tests.integration.snapshot.driven import (
    arrival,
    as_json,
    bus_call,
    nothing_unsaved,
    opened,
    round_before_the_batch,
    stored_calls,
)
from tests.integration.snapshot.test_older_copy_between_rounds import stepped, steps_until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BARRIER, DELETE = "one", "delete-one"


def waits_on_a_lock(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                           "'Lock' AND datname = current_database()").fetchone()
    return bool(row and row[0])


async def test_a_barrier_deleted_between_its_store_and_its_forget_stays_marked(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    part = keys.barrier_partition(BARRIER)
    number = keys.all_partitions().index(part)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 1}, "set")
        await bus_call(state, "state::barrier", arrival(BARRIER, "x", 3), "x")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "x stored", rounds=True)
        await bus_call(state, "state::barrier", arrival(BARRIER, "y", 3), "y")
        assert snap._pg is not None and snap.generation is not None
        with psycopg.connect(postgres_url) as holder:  # (the barrier's row locked)
            holder.execute("SELECT 1 FROM sw_barriers WHERE prefix = %s AND id = %s FOR UPDATE",
                           (prefix, BARRIER))
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(barriers.store_changed, state, snap._pg, prefix, number,
                                 snap.generation, snap.reads)
                await until(lambda: waits_on_a_lock(postgres_url), 30, "the store's commit")
                # (read with x and y: deleted now, before the commit and the forget)
                first = await bus_call(state, "state::delete-barrier", {"id": BARRIER}, DELETE)
                holder.rollback()
        assert client.sismember(part.barriers_changed, part.barrier(BARRIER))
        await round_before_the_batch(snap, keys.id_home(call_field(DELETE)))
        assert call_field(DELETE) not in stored_calls(postgres_url, prefix)
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the deletion stored",
                          rounds=True)
    client.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        assert as_json(await bus_call(state, "state::delete-barrier", {"id": BARRIER},
                                  DELETE)) == as_json(first) == {"deleted": True}
        decided = await bus_call(state, "state::barrier", arrival(BARRIER, "z", 3), "z")
        assert as_json(decided)["decision"] != "allow"  # (the barrier begun anew: z alone)
