"""The one event model: a change event's stream fields <-> `Event`.

The entry scripts write these fields (lua/includes/entry.lua, `emit`) into their partition's
stream; the stream entry id is the event's revision. Everything that reads events back (the
store's `events()`, the coming dispatcher, watches and snapshot) decodes them here.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Raw, Struct

from stateworker.clock import rfc3339_ms


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


class EventDocument(Struct, kw_only=True):
    """An event as programs see it: a trigger handler's call body, a watch's line.

    `{type: "state", event_type, scope, key, old_value, new_value, version, revision, ts}`;
    `by` (the writer) and `ts_ms` are extra fields, `condition_payload` is set by a trigger
    whose barrier condition allowed it (omitted otherwise).
    """

    type: str
    event_type: str
    scope: str
    key: str
    old_value: Raw
    new_value: Raw
    version: int
    revision: str
    ts: str
    ts_ms: int
    by: str | None
    condition_payload: Raw | msgspec.UnsetType = msgspec.UNSET


def document_of(event: Event, condition_payload: Raw | None = None) -> EventDocument:
    return EventDocument(
        type="state", event_type=event.type, scope=event.scope, key=event.key,
        old_value=event.old_value, new_value=event.new_value, version=event.version,
        revision=event.revision, ts=rfc3339_ms(event.ts_ms) or "", ts_ms=event.ts_ms,
        by=event.by or None,
        condition_payload=msgspec.UNSET if condition_payload is None else condition_payload)


_document_encoder = msgspec.json.Encoder()


def document_json(event: Event, condition_payload: Raw | None = None) -> bytes:
    """The event document as compact JSON (values byte-exact as stored)."""
    return _document_encoder.encode(document_of(event, condition_payload))


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
