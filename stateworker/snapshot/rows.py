"""Redis entry hashes -> snapshot rows: the fields read per entry (one HMGET each, pipelined)
and a full scan of one partition's entries (a rescan)."""

from __future__ import annotations

from typing import Any

from stateworker.events.model import revision_of
from stateworker.keys import PartitionKeys
from stateworker.snapshot.tables import Gone, Row
from stateworker.state.store import RedisState

# v value, n version, h hash, t topic, c/u created/updated ms, x expires ms, b updated_by,
# r revision, s plain-strings mark (keys.py has the layout).
FIELDS = ("v", "n", "h", "t", "c", "u", "x", "b", "r", "s")
SCAN_COUNT = 1000


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


def _number(raw: bytes | None) -> int | None:
    return None if raw is None else int(raw)


def row_of(scope: str, key: str, fields: list[Any]) -> Row | None:
    """The row of an entry's HMGET reply; None when the entry is absent."""
    v, n, h, t, c, u, x, b, r, plain = fields
    if v is None:
        return None
    return Row(scope=scope, key=key, value_text=v.decode(), version=int(n), hash=_text(h),
               topic=_text(t), created_ms=_number(c), updated_ms=_number(u),
               expires_ms=_number(x), updated_by=_text(b), revision=revision_of(r or b"0-0"),
               plain=plain == b"1")


async def read_changed(state: RedisState, partition: PartitionKeys,
                       changed: dict[tuple[str, str], tuple[int, int]]
                       ) -> tuple[list[Row], list[Gone]]:
    """The current entries of the keys a batch changed (keyed by their last change's
    revision): rows for those that exist, `Gone` for those that do not."""
    addresses = list(changed)
    replies = await state.conn.pipeline([["HMGET", partition.entry(scope, key), *FIELDS]
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
    """Every entry of a partition (SCAN, then HMGET in pipelines of SCAN_COUNT)."""
    prefix = partition.entry_prefix.encode()
    rows: list[Row] = []
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH",
                                                 partition.entry_prefix + "*",
                                                 "COUNT", SCAN_COUNT, "TYPE", "hash")
        if names:
            replies = await state.conn.pipeline([["HMGET", name, *FIELDS] for name in names])
            for name, fields in zip(names, replies, strict=True):
                row = row_of(*split_member(name[len(prefix):]), fields)
                if row is not None:
                    rows.append(row)
        if cursor in (b"0", "0"):
            return rows
