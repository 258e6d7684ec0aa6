"""Reading change events back from the partition streams."""

from __future__ import annotations

import msgspec

from stateworker.state.schemas import Event
from stateworker.state.store import RedisState


async def read_events(state: RedisState, scope: str, after: str = "-",
                      count: int = 10_000) -> list[Event]:
    """Events of one scope in revision order, after `after` (exclusive; "-" = from start)."""
    part = state.keys.for_scope(scope)
    start = "-" if after == "-" else "(" + after
    entries = await state.conn.execute("XRANGE", part.events, start, "+", "COUNT", count)
    events = []
    for entry_id, flat in entries:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        if fields[b"scope"].decode() != scope:
            continue
        events.append(decode_event(entry_id, fields))
    return events


def decode_event(entry_id: bytes, fields: dict[bytes, bytes]) -> Event:
    return Event(
        revision=entry_id.decode(),
        type=fields[b"type"].decode(),
        scope=fields[b"scope"].decode(),
        key=fields[b"key"].decode(),
        old_value=msgspec.Raw(fields[b"old_value"]),
        new_value=msgspec.Raw(fields[b"new_value"]),
        version=int(fields[b"version"]),
        ts_ms=int(fields[b"ts_ms"]),
        by=fields[b"by"].decode(),
    )
