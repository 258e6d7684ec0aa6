"""The snapshotter's steps (snapshot/snapshotter.py runs them in its loop): a round, once a
`ROUND_S` at least (`_round`), and one partition's batch of events (`_apply`).

A partition whose position is unknown (never snapshotted) or whose unread events the hard
cap cut is rescanned: every entry of the partition (read in parts of about
`rows.BATCH_BYTES`, each upserted as it is read, in the rescan's one transaction), the rows of
those gone removed, and the position set to the stream's end as it was when the scan began.

Barrier state (no change events) is stored once a round per partition held, from the
partition's set of changed barriers (snapshot/barriers.py); a partition whose barriers were
written while no snapshot followed it (unmarked) has them copied whole first. The records of
the bus calls that made a batch's changes are committed with it (snapshot/calls.py); the kept
replies of the writes that run no entry script once a round, when their writes are committed
(kept.py).

Nothing read from a Redis that lost its data reaches PostgreSQL. Each round begins by
confirming the generation (state/generation.py): every marker in Redis is there and is the
one PostgreSQL follows (adopted from Redis when PostgreSQL has none), and no partition it
holds has had fewer events added than PostgreSQL applied (a Redis behind the snapshot: its
markers are removed, so writes there are refused too). Until it is confirmed the
snapshotter commits nothing, and `snapshot:status` says why. Each read from Redis checks the
partition's marker again and each commit the generation row (snapshot/generation.py), so a
wipe or a restore between a read and its commit commits nothing. A new generation (after a
restore) starts again from the positions PostgreSQL holds.

The registry (trigger registrations and namespace claims) is copied whole into `sw_triggers`
and `sw_claims` by the holder of partition 0, at its first round and whenever the registry
stream has a new entry (checked once a round).

A batch: the events after the position, at most `rows.BATCH` and about `rows.BATCH_BYTES`
(never ending inside a transaction: it reaches PostgreSQL whole or not), the current entry of
every key they touched (and of every key a later transaction wrote with one of them: an entry
read now may hold its change), all read in one script (snaprows.lua), and in ONE PostgreSQL transaction
the rows upserted or deleted, the call records and the partition's position; then the position
mirrored into Redis (`snapshotted`, only while the lease holds).

`SnapshotSteps` is a mixin of `Snapshotter`, which holds the state it uses (declared below for
the type checker).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from stateworker.clock import now_ms
from stateworker.errors import Unavailable
from stateworker.events.compaction import stream_info
from stateworker.events.model import revision_of
from stateworker.keys import member
from stateworker.logs import repeats
from stateworker.reactive import trimming
from stateworker.reactive.leases import Leases
from stateworker.scripts.upkeep_bindings import ADVANCE, SNAPREAD, advance_call
from stateworker.snapshot import barriers, calls, kept, rows, tables
from stateworker.snapshot import generation as pg_generation
from stateworker.snapshot.behind import WHY, behind_partitions, count_command, registry_behind, settle
from stateworker.snapshot.tables import REGISTRY, PgConnection, StoredPosition
from stateworker.state import generation
from stateworker.state.core.store import RedisState
from stateworker.state.generation import Markers
from stateworker.transport.plans import pipeline

log = logging.getLogger("stateworker.snapshot")

# The repair at start (snapshot/repair.py; the service passes it: it imports the restore,
# which imports this package's `connect`), run on a prefix left undecided at start.
Decide = Callable[[RedisState, PgConnection], Awaitable[None]]


def _members(rows: list[tables.Row]) -> dict[str, tuple[int, int]]:
    """The rows read, by their entry's member (keys.member: what a call's record names)."""
    return {member(row.scope, row.key): row.revision for row in rows}


class SnapshotSteps:
    """A round and a batch of a `Snapshotter` (module docstring)."""

    state: RedisState
    prefix: str
    replica: str
    leases: Leases
    positions: dict[int, StoredPosition]
    reads: dict[int, int]  # the count of reads PostgreSQL holds of each partition (behind.py)
    generation: str | None
    _lost: str | None
    _lost_parts: set[int]
    _registry_ok: bool
    _registry_copied: bytes | None
    _error_recorded: bool
    decide: Decide | None

    def _forget_positions(self) -> None:
        """Start again from what PostgreSQL holds, once the generation is confirmed again."""
        self.positions.clear()
        self.reads.clear()
        self._registry_copied = None
        self.generation = None

    async def _recovered(self) -> None:
        """Clear the error this replica recorded (not another's, recorded since)."""
        key = self.state.keys.snapshot_status
        if await self.state.conn.execute("HGET", key, "last_error_replica") == \
                self.replica.encode():
            await self.state.conn.execute("HDEL", key, "last_error", "last_error_ms",
                                          "last_error_replica")
        self._error_recorded = False

    async def _round(self, pg: PgConnection) -> None:
        """The generation confirmed (else nothing more), leases (give back the excess, renew,
        take), positions of the partitions taken, rescans of those never snapshotted or cut."""
        confirmed = await self._confirm_generation(pg)
        if confirmed is None:
            return
        excess = self.leases.excess()
        if excess:
            await self.leases.drop(excess)
        await self.leases.round()
        usable = self.leases.held - self._lost_parts  # (the lost ones: nothing is read there)
        for partition in list(self.positions):
            if partition not in usable:
                del self.positions[partition]
        missing = sorted(usable - set(self.positions))
        stored = await tables.positions(pg, self.prefix) if missing else {}
        for partition in missing:
            if partition in stored:
                self.positions[partition] = stored[partition]
                await self._mirror(partition)
        held = sorted(usable)
        infos = await trimming.infos(self.state, held)
        self.reads = await tables.stored_reads(pg, self.prefix)
        behind = await behind_partitions(self.state, self.positions, held, infos,
                                         await barriers.highest_w(pg, self.prefix, held),
                                         self.reads)
        if behind:
            await self._lose(f"{', '.join(behind.values())} ({WHY})", sorted(behind),
                             forget=False)
            held = sorted(usable - self._lost_parts)
            infos = await trimming.infos(self.state, held)
        for partition, info in zip(held, infos, strict=True):
            position = self.positions.get(partition)
            if position is None or info.deleted > position.n:
                await self._rescan(pg, partition, info, position)
        due = set(await barriers.follow(self.state, held)) if held else set()
        for partition in held:
            try:
                if partition in due:
                    await self._rescan_barriers(pg, partition, confirmed)
                await barriers.store_changed(self.state, pg, self.prefix, partition, confirmed,
                                             self.reads)
            except barriers.BarriersBehind as exc:  # (its writes refused from now on)
                await self._lose(exc.message, [partition], forget=False)
                continue
            if partition in self.positions:
                await calls.store_unsaved(self.state, pg, self.prefix, partition,
                                          self.positions[partition], confirmed)
        if 0 in self.leases.held and self._registry_ok:
            try:
                await self._copy_registry(pg, confirmed)
            except pg_generation.RegistryBehind as exc:  # (its writes refused from now on)
                await self.state.conn.execute("DEL", self.state.keys.registry_marker)
                self._registry_ok = False
                await self._lose(exc.message, [], forget=False)
            else:
                await calls.prune(pg, self.prefix, self.state.settings.dedupe_window_ms)
                await barriers.prune(pg, self.prefix)
        for partition in sorted(self.leases.held - self._lost_parts):  # (after this round's)
            await kept.store_covered(self.state, pg, self.prefix, partition, confirmed)
        await self.state.conn.execute("HSET", self.state.keys.snapshot_status, "last_round_ms",
                                      now_ms())

    async def _confirm_generation(self, pg: PgConnection) -> str | None:
        """The generation that Redis's meta marker and PostgreSQL agree on; None (recorded,
        and the markers of a Redis of another generation removed) when they do not. The
        partitions whose own marker is not it (a cluster node that came back empty, a
        partition found behind) are left out (`_lost_parts`, recorded), as is the registry
        when its marker is not it: the others go on."""
        follows = await pg_generation.stored(pg, self.prefix)
        markers = await generation.read(self.state.conn, self.state.keys)
        if markers.restoring == generation.PENDING and self.decide is not None:
            # PostgreSQL was away when the service started on a Redis new to the prefix (or
            # wiped): the repair it could not run then (a restore, or the prefix begun).
            await self.decide(self.state, pg)
            self.decide = None  # (once done: the start's decision, no later one's)
            return None  # (the next round confirms what it decided)
        if follows is None and markers.meta is not None and markers.restoring is None:
            follows = await pg_generation.adopt(pg, self.prefix, markers.meta,
                                                self.state.settings.partitions)
            markers = await generation.read(self.state.conn, self.state.keys)
        # (PostgreSQL first, then Redis: a restore in between has set `restoring`.)
        if markers.stamping is not None and markers.stamping == follows:
            markers = await self._finish_restore(pg, markers)
        if markers.restoring is not None:
            await self._lose(markers.problem() or "a restore is running", [])
            return None
        other = markers.meta is not None and follows is not None and markers.meta != follows
        if other and await pg_generation.stored(pg, self.prefix) != follows:
            return None  # (a restore replaced it meanwhile: the next round sees which)
        if follows is None or other or (follows not in markers.partitions
                                        and markers.registry != follows):
            problem = markers.problem() or "every generation marker of the prefix is gone"
            if other:  # (its markers removed: no write lands in a Redis of other data)
                problem = (f"this Redis holds generation {markers.meta} but PostgreSQL "
                           f"follows {follows} (a Redis of other data, an older copy of it, "
                           "or one a restore elsewhere replaced)")
            await self._lose(problem, list(range(self.state.settings.partitions))
                             if other else [])
            return None
        if markers.meta is None:  # (its node lost it, the others did not: layout kept)
            await generation.keep_meta(self.state.conn, self.state.keys, follows)
        if follows != self.generation:
            if self.generation is not None:  # a restore: PostgreSQL's positions are new too
                self._forget_positions()
            # (a row from before the count was stored gets it: this Redis's, of `follows`)
            await pg_generation.fill_partitions(pg, self.prefix, follows,
                                                self.state.settings.partitions)
            self.generation = follows
        self._lost_parts = {n for n, gen in enumerate(markers.partitions) if gen != follows}
        self._registry_ok = markers.registry == follows
        for partition in self._lost_parts:
            self.positions.pop(partition, None)
        partly = markers.problem()
        if partly is not None:
            await self._lose(partly, [], forget=False)
        elif self._lost is not None:
            log.warning("snapshot: Redis holds generation %s again, as PostgreSQL does; "
                        "snapshotting goes on", self.generation,
                        extra={"event": "snapshot.generation_confirmed"})
            self._lost = None
        return self.generation

    async def _finish_restore(self, pg: PgConnection, markers: Markers) -> Markers:
        """A restore stopped in its last step, writes let in since (`Markers.stamping`):
        finished here, under the restore's lock, unless a restore holds it (then it is
        left to that one). Until then nothing of those writes would be committed. The
        markers after."""
        if not await pg_generation.try_restore_lock(pg, self.prefix):
            return markers
        try:
            await generation.finish(self.state)
        except Unavailable:  # (a slot lost its mark since: a wipe; lost as any other)
            pass
        finally:
            await pg_generation.restore_unlock(pg, self.prefix)
        return await generation.read(self.state.conn, self.state.keys)

    async def _lose(self, reason: str, partitions: list[int], *, forget: bool = True) -> None:
        """Commit nothing more from this Redis (`forget`: from none of it; else from the
        partitions left out already); refuse writes to `partitions` (their markers removed;
        the others' are gone already) and record why for `status`."""
        if forget:
            self._forget_positions()
        for partition in partitions:
            self.positions.pop(partition, None)
            self._lost_parts.add(partition)
        await generation.mark_lost(self.state.conn, self.state.keys, partitions,
                                   reason if partitions else None)
        if reason != self._lost:
            log.error("snapshot stopped: Redis lost data that PostgreSQL holds (%s); nothing "
                      "from it is written to PostgreSQL and writes are refused until it is "
                      "recovered: run `stateworker restore`", reason,
                      extra={"event": "snapshot.store_lost"})
            self._lost = reason

    async def _copy_registry(self, pg: PgConnection, confirmed: str) -> None:
        """The registry copied when its stream has a new entry; RegistryBehind when it is an
        older copy than PostgreSQL's (its read counter: behind.py), checked every round."""
        keys = self.state.keys
        stored = self.reads.get(REGISTRY, 0)
        marker, info, last, triggers, claims, principals, roles, after, counter = \
            await self.state.conn.pipeline([
            ["GET", keys.registry_marker],
            ["XINFO", "STREAM", keys.registry],
            ["XREVRANGE", keys.registry, "+", "-", "COUNT", 1],
            ["HGETALL", keys.triggers],
            ["HGETALL", keys.claims],
            ["HGETALL", keys.principals],
            ["HGETALL", keys.roles],
            ["GET", keys.registry_marker],
            ["GET", keys.registry_reads]])
        if marker != after or marker is None or marker.decode() != confirmed:
            raise pg_generation.Fenced(f"the registry's generation marker is not {confirmed}")
        behind = registry_behind(int(counter or 0), stored)
        last_id = last[0][0] if last else b"0-0"
        if behind is None and last_id == self._registry_copied:
            return
        if behind is None:  # counted after the read: a copy of Redis with the count holds it
            (count,) = await pipeline(self.state.conn, self.state.library,
                                      [count_command(self.state, keys.registry_reads, stored)])
            number = SNAPREAD.read(count).number
            behind = registry_behind(-number, stored) if number <= 0 else None
        if behind is not None:
            raise pg_generation.RegistryBehind(f"{behind} ({WHY})")
        await settle(self.state)
        added = stream_info(info, keys.registry)

        def texts(flat: list[bytes]) -> dict[str, str]:
            return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}

        await tables.replace_registry(pg, self.prefix, texts(triggers), texts(claims),
                                      texts(principals), texts(roles), generation=confirmed,
                                      registry_added=added.entries_added if added else 0,
                                      reads=number)
        self.reads[REGISTRY] = number
        self._registry_copied = last_id
        if last:  # (mirrored after the commit: the kept replies it covers may follow, kept.py)
            await self.state.conn.execute("HSET", keys.registry_snapshotted, "id", last_id)

    async def _rescan(self, pg: PgConnection, partition: int, info: trimming.StreamInfo,
                      position: StoredPosition | None) -> None:
        if position is not None:
            log.error("partition %d: the event stream's cap cut %d events the snapshot had not "
                      "applied; rescanning the partition", partition, info.deleted - position.n,
                      extra={"event": "snapshot.events_cut", "partition": partition})
        start = StoredPosition(info.last_id, info.added)
        assert self.generation is not None
        keys = self.state.keys.partition(partition)
        held: dict[str, tuple[int, int]] = {}  # every row found, by member (calls.py)
        seen: list[tuple[str, str]] = []
        async with tables.rescanning(pg, self.prefix, partition, self.generation) as rescan:
            async for found in rows.scan_partition(self.state, keys, self.generation):
                await rescan.found(found)
                held.update(_members(found))
                seen += [(row.scope, row.key) for row in found]
            read = await rows.count_scan(self.state, keys,
                                         (partition, self.reads.get(partition, 0)))
            unsaved = calls.read_unsaved(self.state, partition, revision_of(start.id),
                                         self.generation, held)
            await rescan.done(seen, start, reads=read, records=unsaved.pages())
        self.reads[partition] = read
        await calls.forget_saved(self.state, partition, unsaved)
        self.positions[partition] = start
        await self._mirror(partition)
        log.info("partition %d: rescanned, %d entries", partition, len(seen),
                 extra={"event": "snapshot.rescanned", "partition": partition,
                        "entries": len(seen)})

    async def _rescan_barriers(self, pg: PgConnection, partition: int, confirmed: str) -> None:
        """The partition's barriers copied whole: some may never have been marked (no
        snapshot followed the partition when they were written: barriers.py)."""
        stored = await barriers.rescan(self.state, pg, self.prefix, partition, confirmed,
                                       self.reads)
        log.info("partition %d: barriers rescanned, %d stored", partition, stored,
                 extra={"event": "snapshot.barriers_rescanned", "partition": partition,
                        "barriers": stored})

    async def _apply(self, pg: PgConnection, partition: int) -> bool:
        """The partition's next batch committed; whether events follow it (rows.read_batch)."""
        assert self.generation is not None
        keys = self.state.keys.partition(partition)
        held = self.positions[partition]
        batch = await rows.read_batch(self.state, keys, self.generation, (partition, held),
                                      self.reads.get(partition, 0))
        if not batch.events:
            return False
        moved = StoredPosition(batch.last, held.n + batch.events)
        # The records of every change the rows hold: a row is read as it is now, so it may
        # hold changes past the batch (calls.py). Read after the rows, from the same
        # generation, a page at a time by the commit.
        unsaved = calls.read_unsaved(self.state, partition, revision_of(moved.id),
                                     self.generation, _members(batch.rows))
        await tables.apply(pg, self.prefix, partition, batch.rows, batch.gone, moved,
                           generation=self.generation, reads=batch.read,
                           records=unsaved.pages())
        self.reads[partition] = batch.read
        self.positions[partition] = moved
        await calls.forget_saved(self.state, partition, unsaved)
        await self._mirror(partition)
        return batch.more

    async def _mirror(self, partition: int) -> None:
        """The committed position into Redis (`snapshotted`), only while the lease holds."""
        keys = self.state.keys.partition(partition)
        position = self.positions[partition]
        replies = await pipeline(self.state.conn, self.state.library, [
            ADVANCE.command(self.state.library, *advance_call(
                keys.snapshot_lease, keys.snapshotted, self.leases.token, position.id,
                position.n)),
            ["HSET", self.state.keys.snapshot_status, "last_commit_ms", now_ms()]])
        if self._error_recorded:  # a position from PostgreSQL: it works again
            await self._recovered()
        if not ADVANCE.read(replies[0]).done:
            repeats.log(log, logging.WARNING, "partition %d: snapshot lease lost; its new "
                        "holder goes on", partition,
                        extra={"event": "snapshot.lease_lost", "partition": partition})
            self.leases.held.discard(partition)
            self.positions.pop(partition, None)
