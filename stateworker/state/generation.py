"""The generation marker: which Redis dataset this is, so nothing from a Redis that lost its
data ever reaches PostgreSQL, and no write lands in it.

A generation is a random id written when the prefix begins in a Redis (`begin`: the first
start on it) and by every restore (`stamp`), and mirrored in PostgreSQL
(snapshot/generation.py). This Redis holds it in three places, one per hash tag a writing
script can check without leaving its slot: the prefix's meta hash (`generation`), each
partition's history hash (`gen`; events/compaction.py) and the registry's string
`generation`. On a Redis Cluster each sits on the node that serves its slot, so a primary
that comes back empty is found by itself.

Every writing script checks its own slot's marker first (lua/includes/generation.lua) and
refuses with STORE_LOST when it is gone: a FLUSHALL, a restart on an empty data directory,
an eviction. Every read checks it too (generation.lua `generation_read_refused`, or
`RedisState.read_plan` for the reads without a script): a key not (yet) back is not known to
be missing, so the read is refused rather than answered with null. A Redis whose markers
are there but which is behind what PostgreSQL holds (an older copy of its data, a replica
promoted before it synced) is found by the snapshotter, which removes the markers of the
partitions concerned (`mark_lost`), so the scripts refuse there too. Only a restore writes
them again; without a PostgreSQL snapshot there is nothing to restore, and `watch_loop`
begins the prefix anew in this Redis (empty) with an error in the log, and a registry
entry `reload`: every replica drops what it held of the lost registry (decision 0066).

`watch_loop` also keeps `state.lost` (why writes are refused, or None) for `/readyz`, the
metrics and `stateworker status`."""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus

from stateworker.clock import now_ms
from stateworker.errors import StateError, Unavailable
from stateworker.events.compaction import begin_history
from stateworker.keys import HISTORY_GENERATION, HISTORY_RESTORING, KeySpace
from stateworker.scripts.bindings import REGISTRY_MAXLEN
from stateworker.scripts.upkeep_bindings import STAMP, stamp_call
from stateworker.state.core.registry import RELOAD
from stateworker.state.core.store import RedisState
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import checked_pipeline, pipeline
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.generation")

META_FIELD = "generation"  # in the meta hash
PARTITION_FIELD = HISTORY_GENERATION  # in each partition's history hash
# in the meta hash (and each history hash) while a restore runs: the generation it writes
RESTORING_FIELD = HISTORY_RESTORING
LOST_FIELD = "lost"  # in `snapshot:status`: why the snapshotter removed markers
SEEN_FIELD = "lost_seen_ms"  # in `snapshot:status`: when a snapshotter last found it lost
WATCH_S = 1.0  # how often `watch_loop` reads the markers


def new_generation() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True, slots=True)
class Markers:
    """The markers this Redis holds (None where one is gone)."""

    meta: str | None
    partitions: tuple[str | None, ...]
    registry: str | None
    restoring: str | None  # a restore that began and has not finished (its generation)
    lost_reason: str | None  # what the snapshotter found (`snapshot:status` lost), if anything
    lost_seen: bool = False  # a snapshotter found this Redis lost (and no restore since)

    @property
    def held(self) -> bool:
        """This Redis held the prefix (a marker is left, or a snapshotter saw it lost): a
        prefix with no marker at all and never seen is new here, not lost."""
        return self.meta is not None or any(self.partitions) or self.registry is not None \
            or self.lost_seen or self.lost_reason is not None

    @property
    def may_begin(self) -> bool:
        """A process may begin the prefix anew in this Redis: no snapshotter found it lost and
        no restore began or waits (else PostgreSQL holds it, and a restore alone brings it
        back: a new generation would let writes in on the empty Redis)."""
        return not self.lost_seen and self.lost_reason is None and self.restoring is None

    @property
    def restore_begun(self) -> bool:
        """A restore began here and has not finished: the next one goes on over what it
        wrote. Not `PENDING` (a prefix new here, undecided): Redis then holds no entry, and
        one that does lost its meta hash alone (a cluster node back empty), not its data."""
        return self.restoring is not None and self.restoring != PENDING

    @property
    def stamping(self) -> str | None:
        """The generation of a restore that stopped in its last step (`stamp`): a slot
        holds it as its marker, so its data was whole and writes were let in there since;
        it is finished (`finish`), never done again (over those writes). None: no such."""
        if not self.restore_begun:
            return None
        stamped = self.restoring in self.partitions or self.registry == self.restoring
        return self.restoring if stamped else None

    @property
    def missing(self) -> list[int]:
        """The partitions whose marker is gone."""
        return [n for n, gen in enumerate(self.partitions) if gen is None]

    def agree(self, generation: str) -> bool:
        """Every marker is there and is `generation`."""
        return self.meta == generation and self.registry == generation and all(
            gen == generation for gen in self.partitions)

    def problem(self) -> str | None:
        """Why this Redis is lost, from the markers alone (and what the snapshotter found,
        when it removed them); None when they all agree."""
        gone = self.missing
        present = {gen for gen in (*self.partitions, self.registry) if gen is not None}
        if self.meta is None and len(gone) == len(self.partitions) and self.registry is None:
            what = "every generation marker of the prefix is gone"
        elif gone or self.registry is None:
            names = [f"partition {n}" for n in gone] + (["the registry"]
                                                         if self.registry is None else [])
            what = f"the generation marker of {', '.join(names)} is gone"
        elif len(present) > 1 or (self.meta is not None and present != {self.meta}):
            what = "the generation markers disagree"
        else:
            return None
        if self.restoring == PENDING:
            what += (" (the prefix is new in this Redis: `stateworker serve` with the "
                     "snapshot asks PostgreSQL at start whether to restore it)")
        elif self.restoring is not None:
            what += " (a restore began and has not finished: run `stateworker restore` again)"
        return f"{what}, since {self.lost_reason}" if self.lost_reason else what


def _text(value: object) -> str | None:
    return value.decode() if isinstance(value, bytes) else None


def _marker(value: object) -> str | None:
    """A marker as read; None when gone, or held by a restore that runs ("~" ...)."""
    text = _text(value)
    return None if text is None or text.startswith("~") else text


async def read(conn: RedisConnection, keys: KeySpace) -> Markers:
    parts = keys.all_partitions()
    meta, lost, *rest = await conn.pipeline([
        ["HMGET", keys.meta, META_FIELD, RESTORING_FIELD],
        ["HMGET", keys.snapshot_status, LOST_FIELD, SEEN_FIELD],
        *[["HGET", p.history, PARTITION_FIELD] for p in parts],
        ["GET", keys.registry_marker]])
    for reply in (meta, lost, *rest):
        if isinstance(reply, ReplyError):
            raise reply
    return Markers(meta=_text(meta[0]), partitions=tuple(_text(g) for g in rest[:-1]),
                   registry=_marker(rest[-1]), restoring=_text(meta[1]),
                   lost_reason=_text(lost[0]), lost_seen=lost[1] is not None)


async def begin(conn: RedisConnection, keys: KeySpace) -> str:
    """The prefix begins in this Redis (or began before the marker existed): a generation
    where none is (replicas starting together agree: the first meta field wins), also on
    the partitions and the registry that have none. The generation."""
    held = await read(conn, keys)  # (a dataset whose meta alone is gone goes on as it was)
    known = [gen for gen in (held.meta, *held.partitions, held.registry) if gen is not None]
    await conn.execute("HSETNX", keys.meta, META_FIELD, known[0] if known else new_generation())
    generation = str((await conn.execute("HGET", keys.meta, META_FIELD)).decode())
    await conn.pipeline([*[["HSETNX", p.history, PARTITION_FIELD, generation]
                           for p in keys.all_partitions()],
                         ["SET", keys.registry_marker, generation, "NX"]])
    return generation


async def keep_meta(conn: RedisConnection, keys: KeySpace, generation: str) -> None:
    """The meta hash again, when its node lost it and the partitions' did not (a cluster):
    its layout facts (partitions; entries packed: state/kv/repack.py) and the generation."""
    await conn.pipeline([["HSETNX", keys.meta, "partitions", keys.partitions],
                         ["HSETNX", keys.meta, "entries", "packed"],
                         ["HSETNX", keys.meta, META_FIELD, generation]])


PENDING = "pending"  # `restoring` of a prefix begun by a service with a snapshot: not yet decided


async def stamp(state: RedisState, generation: str) -> None:
    """A restore's last step: every marker is `generation`, the restore is over. Each slot is
    stamped only while the restore's mark is there (stamp.lua); Unavailable when a slot's is
    gone (Redis wiped during the restore): nothing more is stamped, and writes stay refused."""
    keys, library = state.keys, state.library
    commands = [STAMP.command(library, *stamp_call(p.history, "h", generation))
                for p in keys.all_partitions()]
    commands.append(STAMP.command(library, *stamp_call(keys.registry_marker, "s", generation)))
    replies = await pipeline(state.conn, library, commands)
    if not all(STAMP.read(reply).done for reply in replies):
        raise Unavailable("restore: Redis lost what the restore wrote before it ended (a "
                          "FLUSHALL or a restart without its data during the restore); writes "
                          "stay refused: run `stateworker restore` again", {})
    await checked_pipeline(state.conn, [
        ["HSET", keys.meta, META_FIELD, generation],
        ["HDEL", keys.meta, RESTORING_FIELD],
        ["HDEL", keys.snapshot_status, LOST_FIELD, SEEN_FIELD]], "restore: stamp")


async def finish(state: RedisState) -> str | None:
    """A restore that stopped in its last step (`Markers.stamping`) finished: every slot
    stamped (stamp.lua: again where it was), the meta hash's generation. Its generation;
    None when there is none. Called by whoever holds the restore's lock (a restore, the
    repair at start, a snapshotter): a restore begun since replaced the marks."""
    stamping = (await read(state.conn, state.keys)).stamping
    if stamping is None:
        return None
    log.warning("a restore (generation %s) stopped after it let writes in, before its last "
                "write: finished, not done again (it would undo the writes since)", stamping,
                extra={"event": "generation.restore_finished"})
    await stamp(state, stamping)
    return stamping


async def defer(conn: RedisConnection, keys: KeySpace) -> None:
    """A prefix new in this Redis, opened with a PostgreSQL snapshot configured: no marker
    yet (no write lands) until the repair at start has asked PostgreSQL whether this Redis
    is new or wiped (`begin_fresh`, or a restore)."""
    await conn.execute("HSETNX", keys.meta, RESTORING_FIELD, PENDING)


async def begin_fresh(conn: RedisConnection, keys: KeySpace) -> str:
    """The repair at start found nothing to restore: the prefix begins (`begin`)."""
    generation = await begin(conn, keys)
    await decided(conn, keys)
    return generation


async def decided(conn: RedisConnection, keys: KeySpace) -> None:
    """The repair at start decided: the prefix is no longer `PENDING`."""
    held = await conn.execute("HGET", keys.meta, RESTORING_FIELD)
    if held == PENDING.encode():
        await conn.execute("HDEL", keys.meta, RESTORING_FIELD)


async def mark_lost(conn: RedisConnection, keys: KeySpace, partitions: list[int],
                    reason: str | None) -> None:
    """A snapshotter found this Redis lost: refuse writes to `partitions` (their markers
    removed; with every partition, the registry's too) and say why (`status`); `reason`
    None: the markers say it themselves."""
    registry = [["DEL", keys.registry_marker]] if len(partitions) == keys.partitions else []
    why = [LOST_FIELD, reason[:1000]] if reason is not None else []
    await conn.pipeline([
        *[["HDEL", keys.partition(n).history, PARTITION_FIELD] for n in partitions],
        *registry, ["HSET", keys.snapshot_status, SEEN_FIELD, now_ms(), *why]])


async def begin_restore(conn: RedisConnection, keys: KeySpace, generation: str) -> None:
    """A restore's first step: writes are refused while it runs (every marker removed), a
    restore that stops half way is known (`restoring`: the next one may go on over what it
    wrote), and each slot holds the restore's mark (`stamp` needs it: a wipe takes it)."""
    await checked_pipeline(conn, [
        ["HSET", keys.meta, RESTORING_FIELD, generation],
        *[["HDEL", p.history, PARTITION_FIELD] for p in keys.all_partitions()],
        *[["HSET", p.history, RESTORING_FIELD, generation] for p in keys.all_partitions()],
        ["SET", keys.registry_marker, f"~{generation}"]], "restore: begin")


async def watch_loop(state: RedisState, *,
                     task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Keep `state.lost` current; with no PostgreSQL snapshot, begin anew a prefix whose
    markers are gone (nothing can restore it, and writes would stay refused for good). A new
    generation (a restore) reloads what the registry follower keeps in memory (claims,
    triggers, principals): a restore writes its keys without registry entries."""
    task_status.started()
    seen: str | None = None
    while True:
        try:
            now = await check(state)
            if now is not None and seen is not None and now != seen:
                log.warning("Redis holds a new generation (%s, was %s): the registry reloaded",
                            now, seen, extra={"event": "generation.new"})
                await state.registry.reload()
            seen = now if now is not None else seen
        except (StateError, ConnectionLost, ReplyError) as exc:  # Redis away: the next round
            log.debug("generation check failed: %s", exc)
        await anyio.sleep(WATCH_S)


async def check(state: RedisState) -> str | None:
    """One round of `watch_loop`: the generation every marker agrees on (None: lost)."""
    markers = await read(state.conn, state.keys)
    problem = markers.problem()  # (the state was opened: the prefix began here, markers held)
    # Without a snapshot of its own, this process begins the prefix anew, unless a snapshotter
    # (another process's) found it lost, or a restore runs: then PostgreSQL holds it.
    if problem is not None and state.settings.postgres_url is None and markers.may_begin:
        log.error("Redis lost the data of prefix %s (%s), and with no PostgreSQL snapshot "
                  "(STATEWORKER_POSTGRES_URL) there is nothing to restore it from: the prefix "
                  "begins anew in this Redis", state.settings.prefix, problem,
                  extra={"event": "generation.renewed"})
        await begin_history(state.conn, state.keys, "new")
        await state.conn.execute("HSETNX", state.keys.meta, "partitions", state.keys.partitions)
        renewed = await begin(state.conn, state.keys)
        await state.conn.execute("HDEL", state.keys.snapshot_status, LOST_FIELD, SEEN_FIELD)
        # Every replica's followers and dispatchers reload what the empty registry holds (as
        # after a restore): a dispatcher rereads only the triggers a change names
        # (reactive/trigger_reads.py), so it would go on matching the ones the wipe took.
        await state.conn.execute("XADD", state.keys.registry, "MAXLEN", "~", REGISTRY_MAXLEN,
                                 "*", "kind", RELOAD)
        markers = await read(state.conn, state.keys)
        problem = None if markers.agree(renewed) else markers.problem()
    if problem != state.lost:
        if problem is None:
            log.warning("Redis holds the snapshot's generation again: writes go on",
                        extra={"event": "generation.recovered"})
        else:
            log.error("writes refused: Redis lost data that PostgreSQL holds (%s); run "
                      "`stateworker restore`", problem, extra={"event": "generation.lost"})
        state.lost = problem
    return markers.meta if problem is None else None
