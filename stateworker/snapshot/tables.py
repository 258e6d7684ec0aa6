"""The snapshot's writes to PostgreSQL: one partition batch in ONE transaction (upserts,
deletes, the records of the calls that made them and the partition's position), each behind
the generation fence (snapshot/generation.py), and its reads (positions, for a partition
taken).

Idempotent by construction: an upsert replaces a row only when the stored revision is older,
a delete removes a row only up to the revision of the change that deleted it, and a position
only moves forward. So a batch applied twice (a crash between the commit and the Redis
mirror: read again, counted anew) changes nothing, and no row goes back; one whose read was
counted before the last committed (a replica that lost its lease mid-batch) is refused
whole (`commit_count`)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg

from stateworker.clock import now_ms
from stateworker.snapshot.generation import Fenced, fence, registry_fence, replace
from stateworker.snapshot.generation import PgConnection as PgConnection
from stateworker.snapshot.names import to_pg

UPSERT = """
INSERT INTO sw_entries AS e (prefix, scope, key, partition, value, value_text, version, hash,
    topic, created_ms, updated_ms, expires_ms, updated_by, revision_ms, revision_seq, plain)
VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (prefix, scope, key) DO UPDATE SET
    partition = excluded.partition, value = excluded.value, value_text = excluded.value_text,
    version = excluded.version, hash = excluded.hash, topic = excluded.topic,
    created_ms = excluded.created_ms, updated_ms = excluded.updated_ms,
    expires_ms = excluded.expires_ms, updated_by = excluded.updated_by,
    revision_ms = excluded.revision_ms, revision_seq = excluded.revision_seq,
    plain = excluded.plain
WHERE (e.revision_ms, e.revision_seq) < (excluded.revision_ms, excluded.revision_seq)
"""

DELETE = """
DELETE FROM sw_entries
WHERE prefix = %s AND scope = %s AND key = %s AND (revision_ms, revision_seq) <= (%s, %s)
"""

POSITION = """
INSERT INTO sw_positions AS p (prefix, partition, last_id, last_ms, last_seq, n, updated_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (prefix, partition) DO UPDATE SET
    last_id = excluded.last_id, last_ms = excluded.last_ms, last_seq = excluded.last_seq,
    n = excluded.n, updated_ms = excluded.updated_ms
WHERE (p.last_ms, p.last_seq) <= (excluded.last_ms, excluded.last_seq)
"""

# Rows of a partition not among the keys a full rescan found, up to the rescan's start.
DELETE_UNSEEN = """
DELETE FROM sw_entries e
WHERE e.prefix = %s AND e.partition = %s AND (e.revision_ms, e.revision_seq) <= (%s, %s)
  AND NOT EXISTS (SELECT 1 FROM unnest(%s::text[], %s::text[]) AS seen(scope, key)
                  WHERE seen.scope = e.scope AND seen.key = e.key)
"""


# PostgreSQL's numeric (what jsonb makes of a JSON number) holds at most 16,383 digits after
# the point and a first digit at most 131,071 places before it; exponents of 2**30 and more
# are refused outright. A value's JSON text may hold any number (values stay text, 0001).
NUMERIC_SCALE_MAX, NUMERIC_PLACES_MAX, NUMERIC_EXPONENT_MAX = 16383, 131071, (1 << 30) - 1
# A number that may pass those (an exponent of 5 digits or more, a run of 6,384 digits: with a
# smaller exponent no other is past them); only a value holding one is read number by number.
_MAYBE_PAST = re.compile(r"[eE][-+]?[0-9]{5}|(?<![0-9])[0-9]{6384}")
# A value's strings (skipped whole: a digit in one is no number) and numbers, in order.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?')


def jsonb_takes(text: str) -> bool:
    """Whether PostgreSQL's jsonb takes a value's JSON text: no \\u0000 in a string, no number
    past numeric's bounds. A value it refuses is stored as its text alone (`value` NULL):
    cast, it failed its batch's transaction, and every batch after it, for good (found by
    attack: tests/integration/snapshot/test_values_past_jsonb.py). Asked only of a batch
    jsonb refused (`_upsert`): it reads a large value at ~10-40 ms a MiB."""
    if "\\u0000" in text:
        return False
    if _MAYBE_PAST.search(text) is None:
        return True
    for token in _TOKENS.finditer(text):
        whole, fraction, exponent = token.group(1), token.group(2) or "", token.group(3)
        if whole is None:
            continue  # (a string)
        if exponent and len(exponent.lstrip("+-").lstrip("0")) > 10:
            return False
        power = int(exponent) if exponent else 0
        if abs(power) >= NUMERIC_EXPONENT_MAX or len(fraction) - power > NUMERIC_SCALE_MAX:
            return False
        digits = whole + fraction
        first = len(digits) - len(digits.lstrip("0"))  # (the first digit not 0)
        if first < len(digits) and len(whole) - 1 - first + power > NUMERIC_PLACES_MAX:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Row:
    """One live entry as the snapshot stores it (what Redis's entry hash holds)."""

    scope: str
    key: str
    value_text: str
    version: int
    hash: str | None
    topic: str | None
    created_ms: int | None
    updated_ms: int | None
    expires_ms: int | None
    updated_by: str | None
    revision: tuple[int, int]
    plain: bool = False  # the entry's `s` mark: no string in the value holds a bracket

    def params(self, prefix: str, partition: int, *, checked: bool = False
               ) -> tuple[object, ...]:
        """`checked`: the value asked of `jsonb_takes` (a batch jsonb refused), else only for
        a \\u0000 (what a value almost never holds costs nothing on the way of every row)."""
        # jsonb refuses some texts (`jsonb_takes`): such a value keeps only its exact text.
        takes = jsonb_takes(self.value_text) if checked else "\\u0000" not in self.value_text
        as_jsonb = self.value_text if takes else None
        return (prefix, to_pg(self.scope), to_pg(self.key), partition, as_jsonb,
                self.value_text, self.version, self.hash, to_pg(self.topic), self.created_ms,
                self.updated_ms, self.expires_ms, to_pg(self.updated_by), *self.revision,
                self.plain)


@dataclass(frozen=True, slots=True)
class Gone:
    """An entry absent from Redis after the change at `revision` (the last one read)."""

    scope: str
    key: str
    revision: tuple[int, int]


# The snapshot's count of a partition's reads (lua/snapread.lua), committed with what they
# read; only ever raised, and a commit whose count is not above it is refused
# (`commit_count`).
REGISTRY = -1  # the registry's row (behind.py)
READS = """
INSERT INTO sw_reads AS r (prefix, partition, reads) VALUES (%s, %s, %s)
ON CONFLICT (prefix, partition) DO UPDATE SET reads = excluded.reads
WHERE r.reads < excluded.reads
RETURNING reads
"""


async def commit_count(cursor: psycopg.AsyncCursor[tuple[object, ...]], prefix: str,
                       partition: int, reads: int) -> None:
    """Inside a commit: its read's count (`reads`) above PostgreSQL's, which it becomes; else
    Fenced (rolled back). The read was counted only while Redis's counter was not below the
    count the snapshotter held in memory, which may be older than PostgreSQL's (another
    replica committed since): a copy of Redis older than PostgreSQL's count then counts too,
    and only this check refuses what was read there."""
    await cursor.execute(READS, (prefix, partition, reads))
    if await cursor.fetchone() is None:
        what = "the registry's" if partition == REGISTRY else f"partition {partition}'s"
        raise Fenced(f"{what} snapshot read count {reads} is not above the one PostgreSQL "
                     "holds (a read of an older copy of Redis, or an older read committed "
                     "late): nothing of it was committed")


@dataclass(frozen=True, slots=True)
class StoredPosition:
    id: str
    n: int


CALL_UPSERT = """
INSERT INTO sw_calls (prefix, field, partition, value, revision_ms, revision_seq, at_ms)
VALUES (%s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (prefix, field) DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class CallRow:
    """One bus call's record (snapshot/calls.py): its field, its value as Redis held it, the
    revision of the call's first change, and the call's time."""

    field: bytes
    value: bytes
    revision: tuple[int, int]
    at_ms: int


# The call records a commit carries: given, or read by the commit a page at a time (calls.py's
# `Unsaved.pages`, inside its transaction: never all in memory at once).
Records = Sequence[CallRow] | AsyncIterable[Sequence[CallRow]]


async def _pages(records: Records) -> AsyncIterator[Sequence[CallRow]]:
    if isinstance(records, AsyncIterable):
        async for page in records:
            yield page
    else:
        yield records


async def _records(cursor: psycopg.AsyncCursor[tuple[object, ...]], prefix: str,
                   partition: int, records: Records) -> None:
    async for page in _pages(records):
        if page:
            await cursor.executemany(CALL_UPSERT, [(prefix, r.field, partition, r.value,
                                                    *r.revision, r.at_ms) for r in page])


async def _upsert(cursor: psycopg.AsyncCursor[tuple[object, ...]], prefix: str, partition: int,
                  rows: Sequence[Row], records: Records, generation: str) -> None:
    """A batch's first statements: the fence (PostgreSQL still follows `generation`), the
    records of the calls, the rows written."""
    await fence(cursor, prefix, generation)
    await _records(cursor, prefix, partition, records)
    await _rows(cursor, prefix, partition, rows)


async def _rows(cursor: psycopg.AsyncCursor[tuple[object, ...]], prefix: str, partition: int,
                rows: Sequence[Row]) -> None:
    if rows:
        try:
            async with cursor.connection.transaction():  # (a savepoint)
                await cursor.executemany(UPSERT, [row.params(prefix, partition) for row in rows])
        except psycopg.errors.DataError:  # (jsonb refused a value: `jsonb_takes` asked of each)
            await cursor.executemany(UPSERT, [row.params(prefix, partition, checked=True)
                                              for row in rows])


async def apply(conn: PgConnection, prefix: str, partition: int, rows: Sequence[Row],
                gone: Sequence[Gone], position: StoredPosition, *, generation: str,
                reads: int, records: Records = ()) -> None:
    """One batch: its rows, its deletes, the records of the calls that changed them, the
    partition's new position and the count of the read (`reads`), one transaction, while
    PostgreSQL follows `generation`."""
    ms, _, seq = position.id.partition("-")
    async with conn.transaction(), conn.cursor() as cursor:
        await _upsert(cursor, prefix, partition, rows, records, generation)
        if gone:
            await cursor.executemany(DELETE, [(prefix, to_pg(g.scope), to_pg(g.key),
                                               *g.revision) for g in gone])
        await cursor.execute(POSITION, (prefix, partition, position.id, int(ms), int(seq or 0),
                                        position.n, now_ms()))
        await commit_count(cursor, prefix, partition, reads)


@dataclass(frozen=True, slots=True)
class Rescan:
    """A partition's full rescan, ONE transaction (`rescanning`) fed a part at a time: every
    live entry (`found`), then the end (`done`)."""

    cursor: psycopg.AsyncCursor[tuple[object, ...]]
    prefix: str
    partition: int

    async def found(self, rows: Sequence[Row]) -> None:
        """A part of the entries the rescan read (upserted: only over an older revision)."""
        await _rows(self.cursor, self.prefix, self.partition, rows)

    async def done(self, seen: Sequence[tuple[str, str]], position: StoredPosition, *,
                   reads: int, records: Records = ()) -> None:
        """The records of the calls that made the rows, the rows of entries the rescan did not
        see (`seen`: scope, key) removed up to the position it started from, which becomes
        the partition's, and the count of its read."""
        cursor, prefix, partition = self.cursor, self.prefix, self.partition
        ms, _, seq = position.id.partition("-")
        await _records(cursor, prefix, partition, records)
        await cursor.execute(DELETE_UNSEEN, (prefix, partition, int(ms), int(seq or 0),
                                             [to_pg(scope) for scope, _ in seen],
                                             [to_pg(key) for _, key in seen]))
        await cursor.execute(POSITION, (prefix, partition, position.id, int(ms), int(seq or 0),
                                        position.n, now_ms()))
        await commit_count(cursor, prefix, partition, reads)


@asynccontextmanager
async def rescanning(conn: PgConnection, prefix: str, partition: int, generation: str
                     ) -> AsyncIterator[Rescan]:
    """A rescan's transaction, while PostgreSQL follows `generation`: committed when the block
    ends (after `Rescan.done`), rolled back when it raises. A part at a time, a partition of
    any size is never all in memory, and the rescan stays one commit (the call records of
    decision 0036 with every change they answer)."""
    async with conn.transaction(), conn.cursor() as cursor:
        await fence(cursor, prefix, generation)
        yield Rescan(cursor, prefix, partition)


async def stored_reads(conn: PgConnection, prefix: str) -> dict[int, int]:
    """The count of reads PostgreSQL holds of each partition (those it counted any of)."""
    cursor = await conn.execute("SELECT partition, reads FROM sw_reads WHERE prefix = %s",
                                (prefix,))
    return {int(str(p)): int(str(n)) for p, n in await cursor.fetchall()}


async def positions(conn: PgConnection, prefix: str) -> dict[int, StoredPosition]:
    cursor = await conn.execute(
        "SELECT partition, last_id, n FROM sw_positions WHERE prefix = %s", (prefix,))
    return {int(p): StoredPosition(str(i), int(n))  # type: ignore[call-overload]
            for p, i, n in await cursor.fetchall()}


async def replace_registry(conn: PgConnection, prefix: str, triggers: dict[str, str],
                           claims: dict[str, str], principals: dict[str, str] | None = None,
                           roles: dict[str, str] | None = None, *, generation: str,
                           registry_added: int, reads: int) -> None:
    """The prefix's trigger registrations (id -> JSON), claims (scope -> namespace),
    principals and roles (name -> record JSON) as Redis holds them now, and the copy's count
    (`reads`: snapshot/behind.py), in one transaction, while PostgreSQL follows `generation`
    (an empty registry of a wiped Redis never replaces them)."""
    tables = (("sw_triggers", "id, registration", triggers), ("sw_claims", "scope, namespace",
                                                              claims),
              ("sw_principals", "name, record", principals or {}),
              ("sw_roles", "name, record", roles or {}))
    async with conn.transaction(), conn.cursor() as cursor:
        await registry_fence(cursor, prefix, generation, registry_added)
        for table, columns, rows in tables:
            await cursor.execute(f"DELETE FROM {table} WHERE prefix = %s", (prefix,))
            if rows:
                await cursor.executemany(
                    f"INSERT INTO {table} (prefix, {columns}) VALUES (%s, %s, %s)",
                    [(prefix, to_pg(k), to_pg(v)) for k, v in rows.items()])
        await commit_count(cursor, prefix, REGISTRY, reads)


async def follow(conn: PgConnection, prefix: str, generation: str, registry_added: int,
                 partitions: int) -> None:
    """A restore, before it reads PostgreSQL: PostgreSQL follows its `generation` (a commit
    in progress of the Redis of before ends first; none commits after)."""
    async with conn.transaction(), conn.cursor() as cursor:
        await replace(cursor, prefix, generation, registry_added, partitions)


async def reset_positions(conn: PgConnection, prefix: str,
                          positions: dict[int, StoredPosition], generation: str,
                          registry_added: int) -> None:
    """A restore: set the positions as given, forward or back (new event streams, one per
    partition: their count is the restore's), and PostgreSQL follows the restore's
    `generation` from now on, in one transaction."""
    async with conn.transaction(), conn.cursor() as cursor:
        await replace(cursor, prefix, generation, registry_added, len(positions))
        await cursor.execute("DELETE FROM sw_positions WHERE prefix = %s", (prefix,))
        # (the restored Redis counts its reads anew: an older copy of the Redis of before has
        # another generation's markers)
        await cursor.execute("DELETE FROM sw_reads WHERE prefix = %s", (prefix,))
        await cursor.executemany(POSITION, [
            (prefix, n, p.id, *(int(part or 0) for part in p.id.partition("-")[::2]), p.n,
             now_ms()) for n, p in positions.items()])


async def apply_records(conn: PgConnection, prefix: str, partition: int, records: Records,
                        generation: str) -> None:
    """Call records alone (snapshot/calls.py `store_unsaved`), while PostgreSQL follows
    `generation`; no transaction when there are none (their first page read before it)."""
    pages = _pages(records)
    async for first in pages:
        if first:
            break
    else:
        return
    async with conn.transaction(), conn.cursor() as cursor:
        await fence(cursor, prefix, generation)
        await _records(cursor, prefix, partition, first)
        await _records(cursor, prefix, partition, pages)

