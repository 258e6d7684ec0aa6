"""The repair at start restores a wiped Redis whose prefix PostgreSQL holds only call records
of (snapshot/repair.py, HOLDS): a prefix of barriers alone, its barrier deleted (or expired
and pruned) and no event ever written. It began anew instead: the records were never brought
back, and a retry within the window ran again (a delete-barrier answered `deleted: false`, an
arrival began the barrier anew)."""

from __future__ import annotations

import psycopg
import pytest

from stateworker.errors import StateError
from stateworker.keys import KeySpace, call_field
from stateworker.scripts.bindings import slice_ms
from tests.integration.snapshot.driven import (
    arrival,
    as_json,
    bus_call,
    nothing_unsaved,
    opened,
    stored_calls,
)
from tests.integration.snapshot.test_older_copy_between_rounds import stepped, steps_until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_prefix_of_call_records_alone_is_restored_at_start(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        first = await bus_call(state, "state::barrier", arrival("one", "x"), "x")
        deleted = await bus_call(state, "state::delete-barrier", {"id": "one"}, "delete")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the records stored",
                          rounds=True)
    assert {call_field("x"), call_field("delete")} <= stored_calls(postgres_url, prefix)
    client.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        assert as_json(await bus_call(state, "state::delete-barrier", {"id": "one"},
                                  "delete")) == as_json(deleted) == {"deleted": True}
        assert as_json(await bus_call(state, "state::barrier", arrival("one", "x"),
                                  "x")) == as_json(first)
        assert not client.exists(keys.barrier_partition("one").barrier("one"))


async def test_a_record_the_restore_cannot_write_back_stops_it(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    """A call record PostgreSQL holds that Redis refuses at the restore (here its slice key
    holds another type; Redis at its maxmemory refuses it the same way) stops the restore,
    naming it: gone on past, the retry of that call ran again. Once the key is gone the
    restore goes on and the retry is answered from the record."""
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        first = await bus_call(state, "state::barrier", arrival("one", "x"), "x")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the record stored",
                          rounds=True)
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT at_ms FROM sw_calls WHERE prefix = %s AND field = %s",
                           (prefix, call_field("x"))).fetchone()
    assert row is not None
    client.flushall()
    blocker = keys.call_ids(call_field("x"), int(row[0]) // slice_ms(settings))
    client.set(blocker, "not a hash")
    with pytest.raises(StateError, match="restore: HSET"):
        async with opened(settings):
            pass
    client.delete(blocker)
    async with opened(settings) as state:  # (the repair goes on over what it wrote)
        assert as_json(await bus_call(state, "state::barrier", arrival("one", "x"),
                                      "x")) == as_json(first)
