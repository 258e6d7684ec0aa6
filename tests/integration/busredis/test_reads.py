"""A `strict` read writes nothing that waits for the disk (decision 0058): its call id is bound
in the state's Redis as before, so the id's reuse by another call is refused, but unlogged
(neither in the AOF nor sent to replicas). With the bus on a Redis of its own (its entry and
reply there), a read adds nothing to the state Redis's AOF but the mark and expiry of a new
slice of call records, which keep every slice expiring after a restart from the AOF."""

from __future__ import annotations

from pathlib import Path

import hiredis
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import CallIdReused
from tests.integration.busredis.conftest import Pair
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

READS = 40


def aof_commands(server: RedisServer) -> list[list[bytes]]:
    """Every command in the server's AOF (its incremental files, in order)."""
    reader = hiredis.Reader()
    for path in sorted(Path(server.directory, "appendonlydir").glob("*.incr.aof")):
        reader.feed(path.read_bytes())
    commands: list[list[bytes]] = []
    while (command := reader.gets()) is not False:
        commands.append(command)
    return commands


def record_keys(server: RedisServer, prefix: str) -> list[bytes]:
    return list(server.client().scan_iter(match=f"{prefix}:calls:*", count=1000))


async def test_a_strict_read_binds_its_id_unlogged(pair: Pair, prefix: str, scope: str) -> None:
    settings = pair.settings(prefix)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=5) as client:
        await client.set(scope, "k", {"n": 1})
        for n in range(READS):
            assert await client.call("state::get", {"scope": scope, "key": "k"},
                                     call_id=f"read-{n}") == {"n": 1}
        # Bound all the same: the id of a read is refused for a write, and the write is
        # not applied.
        with pytest.raises(CallIdReused):
            await client.call("state::set", {"scope": scope, "key": "k", "value": 2},
                              call_id="read-7")
        assert await client.get(scope, "k") == {"n": 1}

    records = [c for c in aof_commands(pair.state)
               if len(c) > 1 and c[1].startswith(f"{prefix}:calls:".encode())]
    # In the AOF, a slice's record fields are the writes' alone (one set here), and every
    # slice written has its mark first, then its expiry (Redis logs PEXPIRE as PEXPIREAT).
    fields = [c[2] for c in records if c[0].upper() == b"HSET" and c[2] != b""]
    assert len(fields) == 1
    first: dict[bytes, list[bytes]] = {}
    for command in records:
        first.setdefault(command[1], []).append(command[0].upper())
    assert first and all(ops[:2] == [b"HSET", b"PEXPIREAT"] for ops in first.values())

    # Restarted from its AOF, the state Redis holds every slice with its expiry (none kept
    # for ever), and the reads' bindings are gone with the memory they lived in.
    kept = len(record_keys(pair.state, prefix))
    pair.state.kill()
    pair.state.start()
    client_redis = pair.state.client()
    after = record_keys(pair.state, prefix)
    assert len(after) == kept
    assert all(client_redis.pttl(name) > 0 for name in after)
    assert sum(client_redis.hlen(name) for name in after) == len(after) + 1  # marks, the set
