"""The repair at start (`serve` with a PostgreSQL URL): a Redis that lost what PostgreSQL
holds is rebuilt from it (`stateworker restore`) before the service serves.

The rule, with PostgreSQL holding something of the prefix (a row of an entry, barrier,
trigger or claim, a partition position past event 0, or a call record of the dedupe window:
a prefix of barriers alone may hold nothing else, and its retries need them):
  - Redis is NEW: the prefix's meta key was absent (a new server, or a flushed one);
  - or Redis is LOST: a generation marker is gone (state/generation.py: a cluster node that
    came back empty, a partition the snapshotter found behind) or is not the generation
    PostgreSQL follows (another dataset, or an older copy from before a restore);
  - or Redis is BEHIND: a partition's event stream has had fewer events added than the
    snapshot's position stored in PostgreSQL (events PostgreSQL applied that Redis no longer
    has: a wipe, or a Redis started on an older copy of its data), or its barrier write
    counter is below the highest `w` of its barriers there, or its (or the registry's)
    snapshot read counter below the count of reads PostgreSQL holds (snapshot/behind.py).
Either, with Redis holding no entry of the prefix, is repaired by a restore (with `repair`
off: ConfigError naming `stateworker restore`, and Redis left as found). BEHIND with entries
still in Redis is never repaired automatically: restore rebuilds, it does not merge, and the
entries Redis kept may be newer than PostgreSQL's rows; the service refuses to start and says
what to do. PostgreSQL unreachable at start: a prefix new in this Redis stays undecided
(writes refused) until PostgreSQL answers, and the snapshotter runs the repair then
(`Snapshotter(decide=...)`); a prefix held here goes on, the snapshot retries."""

from __future__ import annotations

import logging

from stateworker.clock import now_ms
from stateworker.errors import ConfigError, RestoreRefused, shown
from stateworker.keys import KeySpace
from stateworker.reactive import trimming
from stateworker.snapshot import barriers, restore, tables
from stateworker.snapshot import generation as pg_generation
from stateworker.snapshot.behind import behind_partitions, registry_reads_behind
from stateworker.snapshot.names import from_pg
from stateworker.snapshot.tables import PgConnection
from stateworker.state import generation, layout
from stateworker.state.core.store import RedisState

log = logging.getLogger("stateworker.snapshot.repair")

HOLDS = """
SELECT EXISTS (SELECT 1 FROM sw_entries WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_barriers WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_triggers WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_claims WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_principals WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_roles WHERE prefix = %(p)s)
    OR EXISTS (SELECT 1 FROM sw_positions WHERE prefix = %(p)s AND n > 0)
    OR EXISTS (SELECT 1 FROM sw_calls WHERE prefix = %(p)s AND at_ms >= %(since)s)
"""


async def repair_at_start(state: RedisState, pg: PgConnection | None) -> None:
    """Check Redis against PostgreSQL and restore it when the rule above says so. `state`: the
    service's, opened and checked, before its registry follower and reaper start; `pg`: the
    start's PostgreSQL connection (`snapshotter.prepare`), left open; None: no PostgreSQL URL,
    or it was unreachable (`prepare` has said so; the snapshot retries). With a URL, before
    anything is served, the barriers are followed (barriers.py `follow`): every replica's
    barrier writes are marked for the snapshot from now on."""
    if state.settings.postgres_url is not None:
        await barriers.follow(state, list(range(state.settings.partitions)))
    if pg is None:
        if state.settings.postgres_url is not None and await _pending(state):
            # Begun blind, a wiped Redis took writes (acknowledged, create-only ones over
            # keys PostgreSQL holds) that the restore then had to throw away.
            log.warning("PostgreSQL is not reachable at start and the prefix is new in this "
                        "Redis (new, or wiped): writes are refused until PostgreSQL answers "
                        "and the snapshotter runs this repair (a restore, or the prefix "
                        "begun)", extra={"event": "repair.deferred"})
        return
    # One replica at a time decides (and restores): those starting together wait, then ask
    # again, and find the Redis the first one restored.
    async with restore.exclusive(pg, state.settings.prefix, wait=True):
        await generation.finish(state)  # (one stopped in its last step: never done again)
        reason = await lost(state, pg)
        if reason is not None:
            await _repair(state, pg, reason)
        elif await _pending(state):  # (a new prefix: PostgreSQL holds nothing of it)
            await generation.begin_fresh(state.conn, state.keys)


async def _pending(state: RedisState) -> bool:
    """The prefix began in this Redis without a marker, for the repair to decide
    (generation.defer)."""
    markers = await generation.read(state.conn, state.keys)
    return markers.restoring == generation.PENDING


async def _meta_put_back(state: RedisState, pg: PgConnection) -> bool:
    """Whether the meta hash was lost alone (on a cluster its node came back empty, the
    partitions' did not: a partition's or the registry's marker is PostgreSQL's generation):
    then it is put back as the snapshotter puts it back (its layout facts, the generation),
    the prefix no longer undecided, and the usual checks follow. Else it is new or wiped.
    LAYOUT_MISMATCH when this service's partition count is not the one PostgreSQL stored
    with the generation: put back, the meta hash took this count over the data's."""
    follows = await pg_generation.stored(pg, state.settings.prefix)
    markers = await generation.read(state.conn, state.keys)
    if follows is None or (follows not in markers.partitions and markers.registry != follows):
        return False
    taken = await pg_generation.stored_partitions(pg, state.settings.prefix)
    if taken is not None and taken != state.keys.partitions:
        # (the meta hash this start wrote with its own count taken back, and the histories
        # of partitions past the prefix's count: the next start finds it lost alone again)
        await state.conn.pipeline([["DEL", state.keys.meta], *[
            ["DEL", p.history] for p in state.keys.all_partitions()[taken:]]])
        raise layout.partitions_differ(state.settings, taken)
    log.warning("the meta hash of prefix %s was lost alone (its partitions are of generation "
                "%s, as PostgreSQL): put back", state.settings.prefix, follows,
                extra={"event": "repair.meta_back"})
    await generation.keep_meta(state.conn, state.keys, follows)
    await generation.decided(state.conn, state.keys)
    state.created = False
    return True


async def lost(state: RedisState, pg: PgConnection) -> str | None:
    """Why Redis needs the restore (new, or behind PostgreSQL); None: it does not."""
    prefix = state.settings.prefix
    since = now_ms() - state.settings.dedupe_window_ms  # (a record a retry may still need)
    row = await (await pg.execute(HOLDS, {"p": prefix, "since": since})).fetchone()
    if not row or not row[0]:
        return None
    if state.created and not await _meta_put_back(state, pg):
        return (f"Redis has no meta hash of prefix {shown(prefix)} ({state.keys.meta}: a new or "
                "wiped Redis) but PostgreSQL holds the prefix")
    markers = await generation.read(state.conn, state.keys)
    problem = markers.problem()
    if problem is not None:
        return f"Redis lost data that PostgreSQL holds: {problem}"
    follows = await pg_generation.stored(pg, prefix)
    if follows is not None and markers.meta != follows:
        return (f"Redis holds generation {markers.meta} of prefix {shown(prefix)}, PostgreSQL "
                f"follows {follows} (other data, or an older copy from before a restore)")
    stored = await tables.positions(pg, prefix)
    held = list(range(state.settings.partitions))  # (barriers: also where no position is)
    reads = await tables.stored_reads(pg, prefix)
    behind = list((await behind_partitions(state, stored, held,
                                           await trimming.infos(state, held),
                                           await barriers.highest_w(pg, prefix, held),
                                           reads)).values())
    registry = await registry_reads_behind(state, reads)
    if registry is not None:
        behind.append(registry)
    if behind:
        return f"Redis is behind PostgreSQL: {', '.join(behind)}"
    return None


async def refuse_healthy(state: RedisState, pg: PgConnection) -> None:
    """`stateworker restore` on a Redis that is not lost (its markers are PostgreSQL's
    generation, no partition behind) would roll it back to the snapshot: the writes and
    deletes PostgreSQL does not hold yet undone, events not handed on yet skipped (the
    positions move to the streams' ends). Refused (RESTORE_REFUSED), unless a restore began
    and has to be finished; emptying the prefix first is the way to roll back on purpose."""
    if (await generation.read(state.conn, state.keys)).restore_begun or \
            await restore.holds_entries(state):  # (the restore refuses that itself)
        return
    if await lost(state, pg) is None:
        prefix = state.settings.prefix
        raise RestoreRefused(
            f"Redis holds prefix {shown(prefix)} whole (its generation is PostgreSQL's, no "
            "partition behind): a restore would undo what the snapshot does not hold yet and "
            "skip events not handed on; nothing was written. To roll back to the snapshot on "
            "purpose, delete the prefix's keys (or FLUSHALL a Redis of its own) and run it "
            "again", {"prefix": prefix})


# Rows read to tell the partition count PostgreSQL's snapshot was taken with, at most.
LAYOUT_SAMPLE = 1000
LAYOUT = """
(SELECT scope, partition FROM sw_entries WHERE prefix = %(p)s LIMIT %(n)s)
UNION ALL (SELECT id, partition FROM sw_barriers WHERE prefix = %(p)s LIMIT %(n)s)
"""


async def refuse_other_partitions(pg: PgConnection, keys: KeySpace, prefix: str) -> None:
    """A restore with another partition count than PostgreSQL's snapshot was taken with
    (`STATEWORKER_PARTITIONS` unset in an operator's shell: 16) is refused (RESTORE_REFUSED,
    naming both counts), before anything is written: it put every scope and barrier in other
    partitions than the services read and write them in (found by attack: a service of 4
    partitions read null for 15 of 20 keys PostgreSQL held, and wrote them again as new).
    Told from the count stored with the generation (`sw_generations.partitions`, decision
    0073); where none is yet, from a position past the count, or a row (entry by scope,
    barrier by id) stored in another partition than this count puts it in. (The rows alone
    let a snapshot of one scope through half the time: 4 partitions restored as 8 when the
    scope's CRC32 gave the same partition under both, and the positions the 8 then stored
    made the right count refused.)"""
    positions = await tables.positions(pg, prefix)
    taken = await pg_generation.stored_partitions(pg, prefix)
    if taken is None:
        rows = await (await pg.execute(LAYOUT, {"p": prefix, "n": LAYOUT_SAMPLE})).fetchall()
        # (a barrier's id picks its partition as a scope does: keys.py `barrier_partition`)
        if all(p < keys.partitions for p in positions) and all(
                keys.partition_of(from_pg(str(name))) == int(str(part)) for name, part in rows):
            return
        taken = max(positions) + 1 if positions else None
    elif taken == keys.partitions:
        return
    raise RestoreRefused(
        f"PostgreSQL's snapshot of prefix {shown(prefix)} was taken with "
        f"{taken or 'another number of'} partitions, not {keys.partitions} "
        "(STATEWORKER_PARTITIONS): restored so, its scopes and barriers would land in other "
        "partitions than the services read and write them in; nothing was written. Run it "
        "with the services' partition count", {"prefix": prefix, "partitions": keys.partitions,
                                               "snapshot_partitions": taken})


async def _repair(state: RedisState, pg: PgConnection, reason: str) -> None:
    prefix = state.settings.prefix
    try:
        await refuse_other_partitions(pg, state.keys, prefix)
    except RestoreRefused as exc:
        await _leave_as_found(state)
        raise ConfigError(exc.message) from exc
    markers = await generation.read(state.conn, state.keys)
    if not markers.restore_begun and await restore.holds_entries(state):
        raise ConfigError(
            f"{reason}, and Redis still holds entries of prefix {shown(prefix)}: restore rebuilds, it "
            f"does not merge. Keep this Redis as it is (start on a copy of its data that is "
            f"not behind), or delete the prefix's keys and run `stateworker restore`")
    if not state.settings.repair:
        await _leave_as_found(state)
        raise ConfigError(f"{reason}: run `stateworker restore` to rebuild it from PostgreSQL "
                          f"(repair at start is off: STATEWORKER_REPAIR=false)")
    log.warning("%s: restoring it from PostgreSQL before serving", reason,
                extra={"event": "repair.start"})
    assert state.settings.postgres_url is not None
    summary = await restore.restore(state, state.settings.postgres_url, pg=pg, locked=True)
    log.warning("repaired: restored %d entries, %d barriers, %d triggers, %d claims in %.3f s",
                summary.entries, summary.barriers, summary.triggers, summary.claims,
                summary.seconds, extra={"event": "repair.done", "entries": summary.entries})
    if summary.principals_without_user or summary.acl_refused:
        log.warning("repaired: principals whose Redis ACL user was missing (recreated off, "
                    "without a password): %s%s; give each a password with `stateworker "
                    "principal passwd NAME`", ", ".join(summary.principals_without_user) or
                    "none", f" (ACL commands refused: {summary.acl_refused})"
                    if summary.acl_refused else "", extra={"event": "repair.principals"})


async def _leave_as_found(state: RedisState) -> None:
    """A repair refused: a Redis new to the prefix is left as found (the next start, or a
    restore, sees it new again, not of this process's layout)."""
    if state.created:
        await state.conn.pipeline([["DEL", name] for name in (
            state.keys.meta, state.keys.registry_marker,
            *(p.history for p in state.keys.all_partitions()))])
