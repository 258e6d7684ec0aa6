"""A key's recent changes, read from its partition's event stream (newest first): what the
console's history shows and `stateworker history` prints. The stream is the only record of
old values; trimming (events_maxlen) bounds how far back it goes, so a read looks at the
partition's last HISTORY_SCAN events, not at the key's whole life."""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.events.model import decode_event, document_json, fields_of
from stateworker.keys import KeySpace
from stateworker.transport.connection import RedisConnection

HISTORY_SCAN = 1000  # among its partition's last events this many (other keys' mostly)
HISTORY_KEEP = 20  # ... the key's last changes this many


async def key_history(conn: RedisConnection, keys: KeySpace, scope: str, key: str
                      ) -> list[msgspec.Raw]:
    """The key's change events (event documents, values as stored) among its partition's
    last HISTORY_SCAN events, newest first, at most HISTORY_KEEP."""
    events_key = keys.partition(keys.partition_of(scope)).events
    entries: list[Any] = await conn.execute("XREVRANGE", events_key, "+", "-", "COUNT",
                                            HISTORY_SCAN)
    found: list[msgspec.Raw] = []
    for entry_id, flat in entries:
        fields = fields_of(flat)
        if fields.get(b"scope") != scope.encode() or fields.get(b"key") != key.encode():
            continue
        try:
            found.append(msgspec.Raw(document_json(decode_event(entry_id, fields))))
        except (KeyError, ValueError):  # not a change event
            continue
        if len(found) == HISTORY_KEEP:
            break
    return found


async def history_document(conn: RedisConnection, keys: KeySpace, scope: str,
                           key: str) -> dict[str, Any]:
    """`{scope, key, scanned, events}`: the console's history and `stateworker history`'s
    JSON."""
    return {"scope": scope, "key": key, "scanned": HISTORY_SCAN,
            "events": await key_history(conn, keys, scope, key)}
