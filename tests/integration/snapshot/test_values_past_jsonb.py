"""A value whose JSON text PostgreSQL's jsonb refuses (a number past its numeric: an exponent
of a million, 16,384 digits after the point) is a value the service accepts and keeps as
text: the snapshot stores it with its exact text (`value` NULL) and goes on with the
partition's other writes.

Found by attack: one such write failed its batch's transaction (`value overflows numeric
format`) and every batch after it, for good: nothing more of that partition reached
PostgreSQL (a wipe lost every write acknowledged there since), `status` showed the error
and a lag that only grew, and the events stayed untrimmed up to the hard cap."""

from __future__ import annotations

import psycopg
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from tests.integration.busproto import until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.integration.snapshot.test_restore import restore_command
from tests.integration.snapshots import caught_up
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

# key -> the value's JSON text (as stored: compact), and whether jsonb holds it (at its
# bounds, one past them)
VALUES = {
    "huge": ('{"n":1e1000000}', False),
    "tiny": ("[1e-16384]", False),
    "long": ("0." + "1" * 16384, False),
    "wide": ("1" * 131073 + ".5", False),
    "edge": ('{"a":1e-16383,"b":"1e-99999","c":9e131071,"d":0e131072}', True),
    "plain": ('{"n":1}', True),
}


async def test_a_value_jsonb_refuses_is_stored_as_text_and_the_partition_goes_on(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        for key, (text, _) in VALUES.items():
            await store.call_json("state::set", f'{{"scope": "s", "key": "{key}", '
                                                f'"value": {text}}}')
        await store.set("s", "after", "next")  # (a write of the same partition after them)
        await until(lambda: caught_up(client, keys), 30, "the snapshot to catch up")
        assert client.hget(keys.snapshot_status, "last_error") is None

    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT key, value_text, value IS NOT NULL FROM sw_entries "
                            "WHERE prefix = %s", (prefix,)).fetchall()
    assert {key: (text, as_jsonb) for key, text, as_jsonb in rows} == {
        **VALUES, "after": ('"next"', True)}

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    async with StateStore.open(own_redis.url, prefix=prefix, partitions=PARTITIONS) as store:
        for key, (text, _) in VALUES.items():
            got = await store.call_json("state::get", f'{{"scope": "s", "key": "{key}"}}')
            assert got == text.encode()
