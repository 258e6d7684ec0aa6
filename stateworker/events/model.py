"""The one event model: a change event's stream fields <-> `Event`.

The entry scripts write these fields (lua/includes/entry.lua, `emit`) into their partition's
stream; the stream entry id is the event's revision. Everything that reads events back (the
store's `events()`, the coming dispatcher, watches and snapshot) decodes them here.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Raw, Struct


class Event(Struct, kw_only=True):
    """One change event as read back from a partition stream."""

    revision: str
    type: str
    scope: str
    key: str
    old_value: Raw
    new_value: Raw
    version: int
    ts_ms: int
    by: str


def fields_of(flat: list[Any]) -> dict[bytes, bytes]:
    """A stream entry's flat [name, value, ...] as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


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
