"""Redis entries -> snapshot rows: each entry read whole (one GET each, pipelined; its stored
form: state/packed.py) and a full scan of one partition's entries (a rescan)."""

from __future__ import annotations

from typing import Any

from stateworker.keys import PartitionKeys
from stateworker.snapshot.tables import Gone, Row
from stateworker.state.packed import unpack
from stateworker.state.store import RedisState

SCAN_COUNT = 1000


def row_of(scope: str, key: str, stored: bytes | None) -> Row | None:
    """The row of an entry's GET reply; None when the entry is absent."""
    if stored is None:
        return None
    e = unpack(stored)
    return Row(scope=scope, key=key, value_text=e.value.decode(), version=e.version,
               hash=e.hash, topic=e.topic, created_ms=e.created, updated_ms=e.updated,
               expires_ms=e.expires, updated_by=e.by, revision=e.revision, plain=e.plain)


async def read_changed(state: RedisState, partition: PartitionKeys,
                       changed: dict[tuple[str, str], tuple[int, int]]
                       ) -> tuple[list[Row], list[Gone]]:
    """The current entries of the keys a batch changed (keyed by their last change's
    revision): rows for those that exist, `Gone` for those that do not."""
    addresses = list(changed)
    replies = await state.conn.pipeline([["GET", partition.entry(scope, key)]
                                         for scope, key in addresses])
    rows: list[Row] = []
    gone: list[Gone] = []
    for (scope, key), fields in zip(addresses, replies, strict=True):
        row = row_of(scope, key, fields)
        if row is None:
            gone.append(Gone(scope, key, changed[(scope, key)]))
        else:
            rows.append(row)
    return rows, gone


def split_member(member: bytes) -> tuple[str, str]:
    """`<len>:<scope><key>` (len in UTF-8 bytes) -> (scope, key)."""
    length, _, rest = member.partition(b":")
    size = int(length)
    return rest[:size].decode(), rest[size:].decode()


async def scan_partition(state: RedisState, partition: PartitionKeys) -> list[Row]:
    """Every entry of a partition (SCAN, then GET in pipelines of SCAN_COUNT)."""
    prefix = partition.entry_prefix.encode()
    rows: list[Row] = []
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH",
                                                 partition.entry_prefix + "*",
                                                 "COUNT", SCAN_COUNT, "TYPE", "string")
        if names:
            replies = await state.conn.pipeline([["GET", name] for name in names])
            for name, fields in zip(names, replies, strict=True):
                row = row_of(*split_member(name[len(prefix):]), fields)
                if row is not None:
                    rows.append(row)
        if cursor in (b"0", "0"):
            return rows
