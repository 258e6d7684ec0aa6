"""The snapshotter: partition events -> rows in PostgreSQL (in `stateworker serve` when
`postgres_url` is set). This module holds its loop; a round's steps and a batch's are
snapshot/steps.py's (`SnapshotSteps`, a mixin of `Snapshotter`).

It follows the partition event streams the way the dispatcher does (reactive/dispatcher.py):
replicas share the partitions with leases of their own (`snapshot_lease`, the replica set
`snapshot:replicas`), and one loop blocks on ONE `XREAD` over the streams it holds, from each
partition's position (on a Redis Cluster one per slot: transport/streamread.py). For a
partition with new events, one script reads its batch (at most `rows.BATCH` events and about
`rows.BATCH_BYTES` of events and entries) and the CURRENT entry of every key the batch touched
(the events lack hash, topic and expiry), with every entry of the transactions after the
batch that wrote one of them (snapshot/rows.py: a transaction reaches PostgreSQL whole), and,
in ONE PostgreSQL transaction, upserts those that exist (only over an older revision),
deletes those that do not (only up to the revision of the change read), and stores the
partition's position. After the commit it
mirrors the position into Redis (`snapshotted`, only while the lease holds): the trimming keeps
every event above it, and `status` shows the lag from it.

A round (leases, positions, rescans, the generation confirmed, barriers, call records, the
registry) and a batch's steps: snapshot/steps.py.

PostgreSQL away: Redis writes go on, the snapshotter records the error and its time (Redis
`snapshot:status`, shown by `status`), backs off (up to MAX_BACKOFF_S) and resumes from the
positions stored in PostgreSQL; the trimming holds the events meanwhile. Once it has a
position from PostgreSQL again (the round that reloads them, a commit), it clears the error
it recorded: `status` shows no error of a snapshot that works.
"""

from __future__ import annotations

import contextlib
import logging
import uuid

import anyio
import psycopg
from anyio.abc import TaskStatus

from stateworker.clock import now_ms
from stateworker.errors import ConfigError, StateError, StoreLost
from stateworker.reactive.follower import follow
from stateworker.reactive.leases import Leases
from stateworker.settings import Settings
from stateworker.snapshot import schema
from stateworker.snapshot.steps import Decide, SnapshotSteps
from stateworker.snapshot.tables import PgConnection, StoredPosition
from stateworker.state.core.store import RedisState
from stateworker.transport.connect import connection_like
from stateworker.transport.retry import Backoff
from stateworker.transport.streamread import StreamReader
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.snapshot")

# The blocking read only wakes the loop: one event per stream that has any. The batch itself
# is read by snaprows.lua, bounded in count and in bytes (snapshot/rows.py: an event holds up
# to two values of max_value_bytes, so a count alone could read ~2 GiB at once).
WAKE = 1
# After a read that found less than a full batch anywhere, wait this long before the next:
# events gather into fewer, larger transactions (one per partition per read). It bounds the
# lag it adds (the lag target is < 1 s) and saved most of the snapshot's cost to writes.
GATHER_S = 0.1
ROUND_S = 1.0  # leases and cut checks at least this often
MAX_BACKOFF_S = 5.0
CONNECT_TIMEOUT_S = 5


async def connect(url: str) -> PgConnection:
    """An autocommit connection (each batch opens its own transaction), schema migrated."""
    conn: PgConnection = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    try:
        await schema.migrate(conn)
    except BaseException:
        await conn.close()
        raise
    return conn


async def prepare(settings: Settings) -> PgConnection | None:
    """At start: without a PostgreSQL URL say once that the service runs on Redis alone;
    with one, connect and migrate the schema (a schema newer than this code: ConfigError, the
    service does not start). The connection is the start's only one: the repair at start
    reads it, then the snapshotter takes it over. PostgreSQL unreachable (None): the service
    starts anyway and the snapshotter retries (writes go on; the lag shows in `status`)."""
    if not settings.postgres_url:
        log.warning("no STATEWORKER_POSTGRES_URL: running on Redis alone (no snapshot in "
                    "PostgreSQL)", extra={"event": "snapshot.off"})
        return None
    try:
        return await connect(settings.postgres_url)
    except (psycopg.Error, OSError) as exc:
        log.warning("PostgreSQL is not reachable at start (%s); the snapshot retries", exc,
                    extra={"event": "snapshot.unreachable"})
        return None


class Snapshotter(SnapshotSteps):
    """Runs until `stop()`."""

    def __init__(self, state: RedisState, url: str, pg: PgConnection | None = None,
                 decide: Decide | None = None) -> None:
        """`pg`: a connection to `url` already migrated (`prepare`'s), taken over and closed
        here; None: connected in the loop. `decide`: the repair at start (the service's),
        run when a round finds the prefix undecided (PostgreSQL was away at start)."""
        self.state = state
        self.decide = decide
        self.url = url
        self.prefix = state.settings.prefix
        self.replica = uuid.uuid4().hex[:12]
        self.leases = Leases(state, self.replica, lease_of=lambda keys: keys.snapshot_lease,
                             replicas=state.keys.snapshot_replicas)
        self.positions: dict[int, StoredPosition] = {}
        self.reads: dict[int, int] = {}
        self._pg: PgConnection | None = pg
        self._reader = StreamReader(connection_like(state.conn))  # (one read per slot on a cluster)
        self._last_round = 0.0
        self._registry_copied: bytes | None = None  # the registry entry last copied
        # The generation confirmed in Redis and PostgreSQL this round (None: not confirmed,
        # nothing is committed); the lost state last recorded, to log each change once.
        self.generation: str | None = None
        self._lost: str | None = None
        self._lost_parts: set[int] = set()  # partitions whose marker is not the generation
        self._registry_ok = False  # the registry's marker is the generation
        self._error_recorded = False  # its error is in `snapshot:status`, to clear on recovery
        self._scope = anyio.CancelScope()

    # ---- the loop ----------------------------------------------------------------------------
    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Snapshot until `stop()`; started once its reader is connected (Redis away then: the
        loop backs off and connects it later; PostgreSQL is never waited for)."""
        backoff = Backoff(max_s=MAX_BACKOFF_S)
        log.info("snapshotting", extra={"event": "snapshot.start", "replica": self.replica})
        try:
            with self._scope:
                await self._reader.conn.try_connect()  # (Redis away: the reads retry)
                task_status.started()
                await follow(self._step, self._step_failed, backoff)
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    def stop(self) -> None:
        self._scope.cancel()

    async def _step_failed(self, exc: Exception) -> None:
        if isinstance(exc, (psycopg.Error, OSError, ConfigError)):
            await self._failed("PostgreSQL", exc)
        elif isinstance(exc, StoreLost):  # (a wipe or a restore since the round)
            log.warning("snapshot: %s; nothing of it was committed", exc.message,
                        extra={"event": "snapshot.fenced"})
            self._forget_positions()
        elif isinstance(exc, (StateError, ConnectionLost, ReplyError)):
            await self._failed("Redis", exc)
        else:  # a bug: the service goes on; the batch is retried
            log.error("snapshot failed", exc_info=exc, extra={"event": "snapshot.crashed"})
            await self._failed("snapshot", exc)

    async def _failed(self, where: str, exc: BaseException) -> None:
        """Log, record the error for `status`, and start again from what PostgreSQL holds."""
        message = f"{where}: {type(exc).__name__}: {exc}".strip()
        log.warning("snapshot paused: %s", message, extra={"event": "snapshot.paused"})
        self._forget_positions()
        await self._close_pg()
        with contextlib.suppress(ConnectionLost, ReplyError):  # Redis away too: the log has it
            await self.state.conn.execute(
                "HSET", self.state.keys.snapshot_status, "last_error", message[:1000],
                "last_error_ms", now_ms(), "last_error_replica", self.replica)
            self._error_recorded = True

    async def _close_pg(self) -> None:
        if self._pg is not None:
            pg, self._pg = self._pg, None
            with contextlib.suppress(psycopg.Error, OSError):
                await pg.close()

    async def _close(self) -> None:
        await self._close_pg()
        try:
            await self.leases.drop_all()
        except (StateError, ConnectionLost, ReplyError) as exc:
            log.warning("could not give back the snapshot leases: %s", exc,
                        extra={"event": "snapshot.stop_failed"})
        await self._reader.close()

    async def _step(self) -> None:
        if self._pg is None or self._pg.closed:
            self._pg = await connect(self.url)
        now = anyio.current_time()
        round_s = min(ROUND_S, self.leases.renew_s)  # (five times per lease at least)
        if now - self._last_round >= round_s or not self.leases.held:
            self._last_round = now
            await self._round(self._pg)
        held = sorted(self.positions)
        if not held:
            await anyio.sleep(round_s)
            return
        streams = [self.state.keys.partition(p).events for p in held]
        ids = [self.positions[p].id for p in held]
        reply = await self._reader.read(["XREAD", "COUNT", WAKE, "BLOCK", int(round_s * 1000)],
                                        streams, ids)
        more = False
        for name, entries in reply or []:
            partition = held[streams.index(name.decode())]
            if entries and partition in self.positions:
                more = await self._apply(self._pg, partition) or more
        if reply and not more:
            await anyio.sleep(GATHER_S)
