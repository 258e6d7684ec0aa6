"""A kept reply (decision 0061, snapshot/kept.py) whose writes are in a partition other than
its id's home, when that partition is lost (on a Redis Cluster: its node came back empty).

What PostgreSQL holds of the lost partition's writes is read there: its `snapshotted`
mirror, its `barriers_changed` set. A node that came back empty has neither: a missing
mirror made the record wait, but a missing mark read as "stored", and the record went to
PostgreSQL without the barrier arrival it answers; after the restore its retry got the first
reply, and the arrival was never applied. Each name the needs read is vouched for by its
partition's generation marker (the registry's for its mirror), read after it: a lost one
makes the record wait (and, once the restore came, it is dropped with the rest)."""

from __future__ import annotations

import pytest

from stateworker.keys import KeySpace, call_field
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

BARRIER = "one"


def away_from(keys: KeySpace, partition: int) -> str:
    """A call id whose home is not `partition`."""
    return next(call_id for call_id in (f"arrive-{n}" for n in range(100))
                if keys.id_home(call_field(call_id)) != partition)


async def test_a_mark_in_a_lost_partition_is_not_taken_for_stored(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    lost = keys.barrier_partition(BARRIER)
    number = keys.all_partitions().index(lost)
    call_id = away_from(keys, number)
    home = keys.id_home(call_field(call_id))
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        await bus_call(state, "state::set", {"scope": "s", "key": "k", "value": 1}, "before")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the writes before",
                          rounds=True)
        first = await bus_call(state, "state::barrier", arrival(BARRIER, "x"), call_id)
        assert client.sismember(lost.barriers_changed, lost.barrier(BARRIER))
        # The barrier's partition is lost before its mark is stored (its node came back
        # empty); the id's home partition is whole.
        client.delete(*client.keys(f"{lost.tag}*"))
        await round_before_the_batch(snap, home)
        assert call_field(call_id) not in stored_calls(postgres_url, prefix)
    client.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        again = await bus_call(state, "state::barrier", arrival(BARRIER, "x"), call_id)
        assert as_json(again) == as_json(first)
        decided = await bus_call(state, "state::barrier", arrival(BARRIER, "y"), "second")
        assert as_json(decided)["decision"] == "allow"  # (`x` arrived: run again after the restore)
