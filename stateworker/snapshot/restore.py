"""`stateworker restore`: rebuild a prefix's Redis state from the PostgreSQL snapshot.

Every row becomes its entry hash again (value text, version, hash, topic,
created/updated/expires, updated_by, revision, the plain-strings mark `s`) with the index members
`lua/includes/entry.lua` writes for it (key, updated, topic, scopes, ttl); the trigger
registrations, claims, principals, roles and barrier hashes (snapshot/barriers.py) go back
exactly as stored. A row whose expiry passed comes back expired: it reads as gone, and the
reaper (refused until the restore's last step, like every write) deletes it with its event
once the restore ended. Not so a trigger whose lease (`ttl_ms`) expired: gone, never brought back
(a leased one goes back with its `expires_at`). A principal whose Redis ACL user is missing
(passwords are never stored) gets its user back with its rule, but off and without a
password: the summary names it in `principals_without_user`, and `stateworker principal
passwd NAME` gives it a password.
The records of bus calls that changed entries in the last dedupe window go back too
(snapshot/calls.py), so a late retry of such a call is answered from its record, not applied
again. Nothing is written to the event streams (each is set to give ids past the newest
revision handed out in it before, whatever this Redis's clock reads: _streams_past), and
every partition's dispatch and snapshot positions are set to its stream's end (also in
PostgreSQL): no trigger fires for a restored entry, and the snapshot goes on from there.
Each partition records that its event history begins anew
(events/compaction.py, `begin_history`): a watch resumed from a revision before the restore
gets COMPACTED, since the events between it and the restore are in no stream.

A Redis that already holds entries of the prefix is refused: restore rebuilds an empty (or
flushed) one; it does not merge. The one exception is a restore that stopped half way (killed,
PostgreSQL gone): the next one goes on over what it wrote (the meta hash's `restoring`). One
that stopped in its last step (a slot stamped: writes let in there since) is finished instead,
by the next restore, the repair at start or a running snapshotter (generation.finish).

The service may run meanwhile: the restore first removes the generation markers, so every
write and every read is refused (STORE_LOST; a read would find what is not back yet missing)
until its last step, which writes its new generation into Redis
after PostgreSQL (state/generation.py); the running services then find the markers agree
again, their snapshotters go on from the positions the restore set, and writes are accepted."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec

from stateworker.clock import now_ms
from stateworker.errors import RestoreRefused, shown
from stateworker.events.compaction import begin_history, stream_info
from stateworker.events.model import Revision, revision_of, revision_text
from stateworker.keys import member
from stateworker.reactive import trimming
from stateworker.scripts.bindings import REGISTRY_MAXLEN
from stateworker.snapshot import barriers, calls, paged, tables
from stateworker.snapshot import generation as pg_generation
from stateworker.snapshot.names import from_pg
from stateworker.snapshot.snapshotter import connect
from stateworker.snapshot.tables import PgConnection
from stateworker.state import generation
from stateworker.state.core.registry import RELOAD
from stateworker.state.core.store import RedisState
from stateworker.state.kv.packed import Stored, pack
from stateworker.state.query import indexes
from stateworker.state.reactive import triggers as registry
from stateworker.state.tenancy import principals as acl
from stateworker.transport.plans import checked_pipeline
from stateworker.transport.wire import ReplyError

ENTRY_COLUMNS = ("scope, key, value_text, version, hash, topic, created_ms, updated_ms, "
                 "expires_ms, updated_by, revision_ms, revision_seq, plain")
# Every row, in pages bounded in rows and bytes (paged.PAGE_ROWS, PAGE_BYTES), each page one
# Redis pipeline.
ENTRIES = paged.Paged("sw_entries", ENTRY_COLUMNS, 2,
                       "octet_length(value_text) + octet_length(scope) + octet_length(key)")


class Summary(msgspec.Struct):
    entries: int = 0
    # Of those, entries whose expiry had passed: back as expired (they read as gone), for the
    # reaper to delete with their event once the restore ended.
    expired: int = 0
    triggers: int = 0
    claims: int = 0
    principals: int = 0
    roles: int = 0
    barriers: int = 0
    calls: int = 0
    # Principals restored whose Redis ACL user was missing (a new Redis): recreated with their
    # rule but off and without a password; `stateworker principal passwd NAME` enables each.
    principals_without_user: list[str] = msgspec.field(default_factory=list)
    # Redis refused the ACL commands (the user restoring may not manage users): why. The
    # operator then runs `stateworker principal list` (acl_user) and `principal passwd`.
    acl_refused: str | None = None
    indexes: int = 0  # value indexes defined again and rebuilt (state/query/indexes.py)
    seconds: float = 0.0
    generation: str = ""  # the generation the restore began (state/generation.py)
    # A restore that stopped in its last step (writes let in since) was finished, not done
    # again: nothing else was written (generation.finish).
    finished: bool = False


def entry_commands(state: RedisState, row: tuple[Any, ...]) -> list[list[Any]]:
    """The writes that make one row an entry again, as the entry scripts leave it."""
    (stored_scope, stored_key, text, version, hash_, stored_topic, created, updated, expires,
     stored_by, rev_ms, rev_seq, plain) = row
    scope, key, topic, by = (from_pg(name) for name in (stored_scope, stored_key,
                                                        stored_topic, stored_by))
    part = state.keys.for_scope(scope)
    stored = Stored(text.encode() if isinstance(text, str) else bytes(text), int(version),
                    created or updated or 0, updated or 0, (int(rev_ms), int(rev_seq)),
                    hash=hash_, expires=expires, topic=topic, by=by, plain=bool(plain))
    commands = [["SET", part.entry(scope, key), pack(stored)],
                ["ZADD", part.key_index(scope), 0, key],
                ["ZADD", part.updated_index(scope), updated or 0, key],
                ["ZADD", part.scopes, 0, scope]]
    if topic is not None:  # (the topic index holds the tagged entries: lua/includes/entry.lua)
        commands.append(["ZADD", part.topic_index(scope), 0, f"{topic}\0{key}"])
    if expires is not None:
        commands.append(["ZADD", part.ttl, expires, member(scope, key)])
    return commands


async def holds_entries(state: RedisState) -> bool:
    """Whether Redis holds any entry of the prefix (a scope index of a partition)."""
    counts = await _run(state, [["ZCARD", p.scopes] for p in state.keys.all_partitions()])
    return any(int(c) for c in counts)


async def _run(state: RedisState, commands: list[list[Any]]) -> list[Any]:
    """A pipeline whose every reply must succeed (an error reply is not restored past)."""
    return await checked_pipeline(state.conn, commands, "restore")


async def _refuse_non_empty(state: RedisState) -> None:
    markers = await generation.read(state.conn, state.keys)
    if not markers.restore_begun and await holds_entries(state):
        raise RestoreRefused(
            f"Redis already holds entries of prefix {shown(state.settings.prefix)}: restore "
            "rebuilds an empty Redis (a new server, or one flushed), it does not merge; nothing "
            "was written. To replace them with the snapshot, delete the prefix's keys (or "
            "FLUSHALL a Redis of its own) and run it again",
            {"prefix": state.settings.prefix})


@asynccontextmanager
async def exclusive(pg: PgConnection, prefix: str, *, wait: bool) -> AsyncIterator[None]:
    """One restore of a prefix at a time, across processes: a PostgreSQL advisory lock of
    the connection's session (a restore killed half way lets go of it with its connection).
    `wait`: until the other one ends (the repair at start: then it asks again whether a
    restore is due); else RESTORE_REFUSED at once."""
    if wait:
        await pg.execute("SELECT pg_advisory_lock(hashtext(%s))",
                         (pg_generation.restore_lock(prefix),))
    elif not await pg_generation.try_restore_lock(pg, prefix):
        raise RestoreRefused(
            f"another restore of prefix {shown(prefix)} is running (it holds the restore's "
            "lock in PostgreSQL): nothing was written; run this one again once it ended, "
            "if it failed", {"prefix": prefix})
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await pg_generation.restore_unlock(pg, prefix)


async def restore(state: RedisState, url: str,
                  progress: Callable[[int, int], None] | None = None, *,
                  pg: PgConnection | None = None, locked: bool = False) -> Summary:
    """Rebuild the prefix from PostgreSQL; `progress(done, total)` after each batch. `pg`: a
    connection to `url` already migrated, used and left open (the repair at start's);
    None: one of its own. `locked`: the caller holds `exclusive` on `pg` (else it is taken
    here, RESTORE_REFUSED when another restore holds it)."""
    started = time.monotonic()
    own = pg is None
    if pg is None:
        pg = await connect(url)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if not locked:
                await stack.enter_async_context(exclusive(pg, state.settings.prefix,
                                                          wait=False))
            summary = await _restore(state, pg, progress)
    finally:
        if own:
            await pg.close()
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


async def _restore(state: RedisState, pg: PgConnection,
                   progress: Callable[[int, int], None] | None) -> Summary:
    # One that stopped in its last step wrote all its data and let writes in since: done
    # again, it would undo them (and skip their events), so it is finished instead.
    finished = await generation.finish(state)
    if finished is not None:
        return Summary(finished=True, generation=finished)
    await _refuse_non_empty(state)
    prefix = state.settings.prefix
    generation_id = generation.new_generation()
    await generation.begin_restore(state.conn, state.keys, generation_id)
    # PostgreSQL follows the restore's generation before anything is read from it: a commit
    # of what a snapshotter read in the Redis of before ends first, and none commits after,
    # so the rows, barriers and call records read below are one state (a call's record is
    # never restored without its change, decision 0036).
    await tables.follow(pg, prefix, generation_id, await _registry_added(state),
                        state.settings.partitions)
    summary = Summary()
    # Every row, those whose expiry passed too (in Redis they read as gone): the reaper
    # deletes them once the restore ended, with the event their expiry owes (a trigger is
    # called, the row leaves PostgreSQL). Left out, an expiry that passed while Redis was
    # away was never written: no trigger called, the row in sw_entries for good.
    # Each partition's newest revision handed out before: its rows', its snapshot position
    # (a delete's or an expiry's event is no row's) and its triggers' starts (below).
    newest = {n: revision_of(p.id) for n, p in (await tables.positions(pg, prefix)).items()}
    async with pg.transaction():
        # (one snapshot of the table for the count and every page: the progress ends at it)
        await pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        counted = await (await pg.execute(
            "SELECT count(*) FILTER (WHERE expires_ms <= %s), count(*) FROM sw_entries "
            "WHERE prefix = %s", (now_ms(), prefix))).fetchone()
        summary.expired, total = (int(counted[0]), int(counted[1])) if counted else (0, 0)  # type: ignore[call-overload]
        async for batch in paged.pages(pg, ENTRIES, prefix):
            await _run(state, [c for row in batch for c in entry_commands(state, row)])
            for scope, *_, rev_ms, rev_seq, _plain in batch:
                n = state.keys.partition_of(from_pg(str(scope)))
                newest[n] = max(newest.get(n, (0, 0)), (int(str(rev_ms)), int(str(rev_seq))))
            summary.entries += len(batch)
            if progress is not None:
                progress(summary.entries, total)
    summary.triggers, summary.claims = await _restore_registry(state, pg, newest)
    await _restore_principals(state, pg, summary)
    summary.barriers = await barriers.restore(state, pg)
    summary.calls = await calls.restore(state, pg)
    await _streams_past(state, newest, generation_id)
    await _positions_to_ends(state, pg, generation_id)
    await begin_history(state.conn, state.keys, "restore")
    # Running replicas reload the claims, triggers and principals restored (their
    # registry followers) before the markers let writes in again.
    await _run(state, [["XADD", state.keys.registry, "MAXLEN", "~", REGISTRY_MAXLEN, "*",
                        "kind", RELOAD]])
    # The entries are back, their value indexes are not: built again from their
    # definitions, which came back as entries of `state_indexes`.
    summary.indexes = await indexes.rebuild_all(state)
    await generation.stamp(state, generation_id)  # (writes are let in from here)
    summary.generation = generation_id
    return summary


async def _restore_registry(state: RedisState, pg: PgConnection,
                            newest: dict[int, Revision]) -> tuple[int, int]:
    prefix, keys = state.settings.prefix, state.keys
    triggers = await (await pg.execute(
        "SELECT id, registration FROM sw_triggers WHERE prefix = %s", (prefix,))).fetchall()
    claims = await (await pg.execute(
        "SELECT scope, namespace FROM sw_claims WHERE prefix = %s", (prefix,))).fetchall()
    restored, commands = _trigger_commands(state, [(from_pg(str(i)), str(r))
                                                   for i, r in triggers], newest)
    commands += [["HSET", keys.claims, from_pg(str(s)), from_pg(str(n))] for s, n in claims]
    # The owners' shares are counted again from the registrations restored, by the first
    # trigger script that needs them (lua/includes/shares.lua): none left from before.
    commands.append(["DEL", keys.trigger_owners])
    if commands:
        await _run(state, commands)
    return restored, len(claims)


def _trigger_commands(state: RedisState, rows: list[tuple[str, str]],
                      newest: dict[int, Revision]) -> tuple[int, list[list[Any]]]:
    """The triggers still registered, and their commands: one whose lease (`ttl_ms`) expired
    is gone, never brought back; a leased one goes back with its expiry (`trigger_leases`).
    Each one's `start_revisions` raise `newest`: it sees only events past its start."""
    now, keys = now_ms(), state.keys
    commands: list[list[Any]] = []
    restored = 0
    for trigger_id, registration in rows:
        trigger = registry.decode_trigger(registration.encode())
        if not registry.live(trigger, now):
            continue
        restored += 1
        for partition, start in (trigger.start_revisions or {}).items():
            newest[partition] = max(newest.get(partition, (0, 0)), revision_of(start))
        commands.append(["HSET", keys.triggers, trigger_id, registration])
        expires = registry.expires_ms(trigger)
        if expires is not None:
            commands.append(["ZADD", keys.trigger_leases, expires, trigger_id])
    return restored, commands


async def _restore_principals(state: RedisState, pg: PgConnection, summary: Summary) -> None:
    """The principals and roles as stored, each principal's stream to the state service with
    its group, and an ACL user (off, no password) for each principal that has none."""
    prefix, keys = state.settings.prefix, state.keys
    principals = await (await pg.execute(
        "SELECT name, record FROM sw_principals WHERE prefix = %s", (prefix,))).fetchall()
    roles = await (await pg.execute(
        "SELECT name, record FROM sw_roles WHERE prefix = %s", (prefix,))).fetchall()
    commands: list[list[Any]] = [["HSET", keys.principals, from_pg(str(n)), from_pg(str(r))]
                                 for n, r in principals]
    commands += [["HSET", keys.roles, from_pg(str(n)), from_pg(str(r))] for n, r in roles]
    if commands:
        await _run(state, commands)
    summary.principals, summary.roles = len(principals), len(roles)
    for stored_name, _ in principals:
        await acl.ensure_stream(state, from_pg(str(stored_name)))
    try:
        for stored_name, _ in principals:
            name = from_pg(str(stored_name))
            if not await acl.has_user(state, name):
                await acl.set_user(state, name, None)
                summary.principals_without_user.append(name)
        if summary.principals_without_user:
            await acl.save_acl(state)
    except ReplyError as exc:  # NOPERM: a service user without ACL rights (a repair at start)
        summary.acl_refused = str(exc)
    await state.access.reload()


async def _streams_past(state: RedisState, newest: dict[int, Revision],
                        generation_id: str) -> None:
    """Each partition's event stream made to give ids past the newest revision handed out
    there before (`XSETID`; an empty stream made for it where there is none): the rows', the
    snapshot's position, the restored triggers' starts. A revision is a stream id, from the
    clock of the Redis that gave it: one whose clock ran ahead of this one's gave revisions
    this Redis would give again, lower, to the writes after the restore. The snapshot, which
    moves a row only to a newer revision and deletes it only up to its delete's, kept their
    rows as they were (found by attack: tests/integration/snapshot/
    test_restore_clock_behind.py); a restored trigger, which sees only events past its start,
    was not called for them, and a watch resumed from a bookmark of before skipped them
    without COMPACTED once the clock passed it (test_restore_clock_behind_starts.py). Where
    there is no stream, a group made and destroyed makes it, empty (an entry would wake the
    streams' readers; the group is named by the restore's generation: none is left over
    from another). These
    commands are in the service's rule: the repair at start runs this."""
    infos = await trimming.infos(state, list(newest))
    commands: list[list[Any]] = []
    for (n, revision), info in zip(newest.items(), infos, strict=True):
        if revision <= revision_of(info.last_id):
            continue
        events = state.keys.partition(n).events
        if info.last_id == "0-0":  # (no stream: XSETID needs one)
            group = f"restore:{generation_id}"
            commands += [["XGROUP", "CREATE", events, group, "$", "MKSTREAM"],
                         ["XGROUP", "DESTROY", events, group]]
        commands.append(["XSETID", events, revision_text(revision)])
    if commands:
        await _run(state, commands)


async def _positions_to_ends(state: RedisState, pg: PgConnection, generation_id: str) -> None:
    """Dispatch and snapshot positions at every stream's end: nothing restored is an event;
    in PostgreSQL with the restore's generation (from now on the one it follows). Kept replies
    waiting from before (a Redis that kept some streams) are dropped: the positions now claim
    what PostgreSQL may not hold of them (snapshot/kept.py); so is the registry's copy's. The
    barriers are followed, and copied whole once (barriers.py: Redis may hold some of its own,
    unmarked)."""
    count = state.settings.partitions
    infos = await trimming.infos(state, list(range(count)))
    commands: list[list[Any]] = [["DEL", state.keys.registry_snapshotted]]
    for n, info in enumerate(infos):
        part = state.keys.partition(n)
        commands += [["HSET", part.dispatched, "id", info.last_id, "n", info.added],
                     ["HSET", part.snapshotted, "id", info.last_id, "n", info.added],
                     ["DEL", part.unsaved_kept],
                     ["HSET", part.history, barriers.FOLLOWED_FIELD, barriers.RESCAN]]
    await _run(state, commands)
    await tables.reset_positions(pg, state.settings.prefix,
                                 {n: tables.StoredPosition(i.last_id, i.added)
                                  for n, i in enumerate(infos)}, generation_id,
                                 await _registry_added(state))


async def _registry_added(state: RedisState) -> int:
    """The entries ever added to the registry stream (0: none yet)."""
    (reply,) = await state.conn.pipeline([["XINFO", "STREAM", state.keys.registry]])
    registry = stream_info(reply, state.keys.registry)
    return registry.entries_added if registry else 0
