"""A key's recent changes, read from its partition's event stream (newest first): what the
console's history shows and `stateworker history` prints. The stream is the only record of
old values; trimming (events_maxlen) bounds how far back it goes, so a read looks at the
partition's last HISTORY_SCAN events, not at the key's whole life.

Read in pages, and no more than HISTORY_BYTES of them: each event holds its old and new
values (up to max_value_bytes each), so the partition's last 1,000 events whole could be
~2 GB for one GET. A page holds as many events as the bytes left allow at the size of
those read so far (the first: PAGE_FIRST); a read stopped by the bytes says so."""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.events.model import decode_event, document_json, fields_of
from stateworker.keys import KeySpace
from stateworker.transport.connection import RedisConnection

HISTORY_SCAN = 1000  # among its partition's last events this many (other keys' mostly)
HISTORY_KEEP = 20  # ... the key's last changes this many
HISTORY_BYTES = 8 * 1024 * 1024  # ... read from Redis at most this many bytes (about)
PAGE_FIRST = 10  # events of the first page (its events' sizes size the next ones)
PAGE_MOST = 100  # events of a page at most


class Found(msgspec.Struct):
    events: list[msgspec.Raw]  # the key's changes, newest first
    read: int  # events read
    stopped_early: bool  # HISTORY_BYTES read before HISTORY_SCAN events or HISTORY_KEEP changes


async def key_history(conn: RedisConnection, keys: KeySpace, scope: str, key: str) -> Found:
    """The key's change events (event documents, values as stored) among its partition's
    last HISTORY_SCAN events, newest first, at most HISTORY_KEEP, read within HISTORY_BYTES."""
    events_key = keys.partition(keys.partition_of(scope)).events
    found = Found([], 0, False)
    size, end, count = 0, "+", PAGE_FIRST
    while found.read < HISTORY_SCAN:
        asked = min(count, HISTORY_SCAN - found.read)
        entries: list[Any] = await conn.execute("XREVRANGE", events_key, end, "-", "COUNT",
                                                asked)
        for entry_id, flat in entries:
            found.read += 1
            size += sum(len(v) for v in flat)
            fields = fields_of(flat)
            if fields.get(b"scope") != scope.encode() or fields.get(b"key") != key.encode():
                continue
            try:
                found.events.append(msgspec.Raw(document_json(decode_event(entry_id, fields))))
            except (KeyError, ValueError):  # not a change event
                continue
            if len(found.events) == HISTORY_KEEP:
                return found
        if len(entries) < asked:  # (the stream's start)
            return found
        if size >= HISTORY_BYTES:
            found.stopped_early = found.read < HISTORY_SCAN
            return found
        entry_id = entries[-1][0]
        end = "(" + (entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id))
        count = max(1, min(PAGE_MOST, (HISTORY_BYTES - size) * found.read // max(size, 1)))
    return found


async def history_document(conn: RedisConnection, keys: KeySpace, scope: str,
                           key: str) -> dict[str, Any]:
    """`{scope, key, scanned, read, stopped_early, events}`: the console's history and
    `stateworker history`'s JSON (`scanned`: how far back it looks; `read`: the events it
    read; `stopped_early`: it read HISTORY_BYTES before it got there)."""
    found = await key_history(conn, keys, scope, key)
    return {"scope": scope, "key": key, "scanned": HISTORY_SCAN, "read": found.read,
            "stopped_early": found.stopped_early, "events": found.events}
