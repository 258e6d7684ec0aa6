"""One start-up: the state service opens its Redis state once (waiting out a Redis that is not
serving yet on that same connection) and hands it to the repair at start, connects to and
migrates PostgreSQL once, and starts every loop before it yields. Counted on the real servers:
Redis's `total_connections_received`, PostgreSQL's `pg_stat_database.sessions`."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import psycopg
import pytest
import redis

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ReplyError
from tests.integration.busproto import until
from tests.servers import PostgresServer, RedisServer

pytestmark = pytest.mark.anyio

# The Redis connections the service makes before it serves its first call (an external Redis,
# the dispatcher and the snapshot on); none is opened twice:
#   1. the state's connection: waits out LOADING / BUSY, the server checks, the script library,
#      the repair at start; then every script, the reaper, and the bus's replies,
#      acknowledgements and counters (all pipelined on it)
#   2. the registry follower (XREAD BLOCK on the registry stream)
#   3. the bus runtime's reader (XREADGROUP BLOCK on `<prefix>:bus:state`)
#   4. the dispatcher's reader (XREAD BLOCK over the registry and its partitions)
#   5. the snapshotter's reader (XREAD BLOCK over its partitions)
#   6. the dispatcher's own connection: its leases, deliveries, positions and counters, so
#      they never wait in the bus's pipelines (RedisState.on_own_connection)
SERVICE_REDIS_CONNECTIONS = 6
# The test's StateClient: its sending connection and its reply reader (BLMPOP).
CLIENT_REDIS_CONNECTIONS = 2
# PostgreSQL: one session, migrated at start, read by the repair check, then the snapshotter's.
SERVICE_POSTGRES_SESSIONS = 1

# A script that keeps Redis busy (every other client gets BUSY) for ARGV[1] ms.
BUSY_SCRIPT = """local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local stop = now() + tonumber(ARGV[1]) * 1000
while now() < stop do end
return 1"""


def connections_received(monitor: redis.Redis) -> int:
    """Connections Redis accepted since it started (the monitor's own included: it asks on
    one connection, made by its first command)."""
    return int(monitor.info("stats")["total_connections_received"])


def postgres_sessions(admin: psycopg.Connection[tuple[int, int]], database: str
                      ) -> tuple[int, int]:
    """(sessions ever established to `database`, client backends connected to it now). Asked
    from another database, so the asking is not counted."""
    row = admin.execute(
        "SELECT (SELECT sessions FROM pg_stat_database WHERE datname = %(d)s),"
        " (SELECT count(*) FROM pg_stat_activity WHERE datname = %(d)s"
        "  AND backend_type = 'client backend')", {"d": database}).fetchone()
    assert row is not None
    return int(row[0] or 0), int(row[1])


async def test_start_up_makes_six_redis_connections_and_one_postgres_session(
        own_redis: RedisServer, postgres_server: PostgresServer, postgres_url: str,
        prefix: str) -> None:
    database = psycopg.conninfo.conninfo_to_dict(postgres_url)["dbname"]
    assert isinstance(database, str)
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url)
    with own_redis.client() as monitor, psycopg.connect(postgres_server.url,
                                                        autocommit=True) as admin:
        before = connections_received(monitor)
        assert postgres_sessions(admin, database) == (0, 0)
        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings) as client:
            await client.set("s", "k", 1)  # the first call: its reply has arrived
            made = connections_received(monitor) - before

            def settled() -> bool:
                # Only the snapshotter's session is still connected (the backends of any
                # session closed before have exited, which reports their counts), and it
                # has reported its own (at its first idle moment).
                sessions, connected = postgres_sessions(admin, database)
                return connected == 1 and sessions >= 1

            await until(settled, 30, "PostgreSQL's session counts to be reported")
            sessions, _ = postgres_sessions(admin, database)
    assert made == SERVICE_REDIS_CONNECTIONS + CLIENT_REDIS_CONNECTIONS
    assert sessions == SERVICE_POSTGRES_SESSIONS


async def test_a_busy_redis_is_waited_out_on_the_state_connection(
        own_redis: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4)
    caplog.set_level(logging.WARNING, logger="stateworker.service")
    with own_redis.client() as monitor, own_redis.client() as blocker:
        monitor.config_set("busy-reply-threshold", 100)  # BUSY after 100 ms of a script
        blocker.ping()  # its connection made now, before the count starts
        before = connections_received(monitor)
        probe = RedisConnection(own_redis.url)  # one connection, asking again and again

        async def busy() -> bool:
            try:
                await probe.execute("PING")
            except ReplyError as exc:
                return str(exc).startswith("BUSY ")
            return False

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, blocker.eval, BUSY_SCRIPT, 0, 1500)
            await until(busy, 10, "Redis to answer BUSY")
            await probe.close()
            async with StateService.running(settings, BusOptions(block_ms=50)), \
                    StateClient(settings=settings) as client:
                await client.set("s", "k", 1)
                made = connections_received(monitor) - before
    waited = [r for r in caplog.records if getattr(r, "event", "") == "service.waiting"]
    assert len(waited) == 1 and "BUSY" in waited[0].getMessage()
    # The probe's connection, the service's (the wait made none of its own), the client's;
    # without the snapshot the service has no snapshotter reader.
    assert made == 1 + (SERVICE_REDIS_CONNECTIONS - 1) + CLIENT_REDIS_CONNECTIONS


async def test_the_embedded_redis_is_started_once(tmp_path: Path, postgres_url: str,
                                                  prefix: str) -> None:
    """With no Redis URL and the snapshot on, the managed redis-server the repair check reads
    is the one the service serves on: started once, not started, stopped and started again."""
    settings = Settings(state_dir=str(tmp_path), prefix=prefix, partitions=4,
                        postgres_url=postgres_url)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client:
        await client.set("s", "k", 1)
    starts = (tmp_path / "redis.log").read_text().count("Server initialized")
    assert starts == 1
