"""A call over HTTP with an Idempotency-Key, its change and record in PostgreSQL, Redis wiped
and restored: the same key (and the same id over the bus) gets the first reply and changes
nothing, for the calls test_restore's bus test leaves out: an update op, a transaction,
set-many and delete-many. (The writes that run no entry script: test_kept_after_restore.py.)"""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.snapshot.test_restore import restore_command
from tests.integration.snapshots import calls_saved
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

INC = [{"type": "increment", "path": "n", "by": 1}]
CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("h-upd", "state::update", {"scope": "r", "key": "u", "ops": INC}),
    ("h-tx", "state::transaction", {"scope": "r", "ops": [
        {"op": "update", "key": "t", "ops": INC}, {"op": "set", "key": "t2", "value": 1}]}),
    ("h-sm", "state::set-many", {"scope": "r", "entries": [{"key": "m1", "value": 1},
                                                            {"key": "m2", "value": 2}]}),
    ("h-dm", "state::delete-many", {"scope": "r", "entries": [{"key": "m2"}]}),
]


async def test_http_retries_after_a_restore_get_their_reply(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000, http="127.0.0.1:0")
    client, keys = own_redis.client(), KeySpace(prefix, 4)
    first: dict[str, bytes] = {}
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http:
        for key, fn, body in CALLS:
            response = await http.post(f"/v1/call/{fn}", content=msgspec.json.encode(body),
                                       headers={"Idempotency-Key": key})
            assert response.status_code == 200, response.text
            first[key] = response.content

        await until(lambda: calls_saved(client, keys), 60,
                    "the snapshot and the call records to catch up")

    client.flushall()
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout)["calls"] == len(CALLS)

    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}") as http, \
            StateClient(settings=settings) as bus:
        for key, fn, body in CALLS:
            again = await http.post(f"/v1/call/{fn}", content=msgspec.json.encode(body),
                                    headers={"Idempotency-Key": key})
            assert (again.status_code, again.content) == (200, first[key])
            over_bus = await bus.call_json(fn, msgspec.json.encode(body), call_id=key)
            assert msgspec.json.decode(over_bus) == msgspec.json.decode(first[key])["result"]
        async with StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store:
            values = {k: (e.value, e.version) for k in ("u", "t", "t2", "m1", "m2")
                      if (e := await store.get_entry("r", k)).found}
            assert values == {"u": ({"n": 1}, 1), "t": ({"n": 1}, 1), "t2": (1, 1),
                              "m1": (1, 1)}
            assert await store.events("r") == []  # the retries wrote nothing
