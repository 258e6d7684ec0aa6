"""The one event model: a change event's stream fields <-> `Event`.

The entry scripts write these fields (lua/includes/entry.lua, `entry_emit`) into their partition's
stream; the stream entry id is the event's revision. Everything that reads events back (the
store's `events()`, watches, the coming dispatcher and snapshot) decodes them here; the
documents programs see (a trigger's body, a watch's line, a bookmark) are encoded here too.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Raw, Struct

from stateworker.clock import rfc3339_ms
from stateworker.errors import InvalidRequest, shown

Revision = tuple[int, int]  # a stream id `<ms>-<seq>` as numbers: sorts as Redis sorts ids
MAX_SEQ = 2**64 - 1  # the largest sequence number of a stream id


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
    tx: str | None = None  # a transaction's id: its events are consecutive and share it
    tx_size: int | None = None  # ... and how many they are
    # The stream field `tp`, only in the events of a traced call: the traceparent of the
    # service's span of the call that wrote it (tracing.py); a trigger's delivery is its child.
    # Not in the documents programs see (the event's contract): a trigger call carries it in
    # its context.
    traceparent: str | None = None


class Bookmark(Struct, kw_only=True):
    """A watch's progress mark: every event up to `revision` has been handed on (or passed
    over by the watch's filter) and none after it; a watch resumed from it re-reads nothing."""

    revision: str


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
    tx: str | msgspec.UnsetType = msgspec.UNSET  # a transaction's events: its id
    tx_size: int | msgspec.UnsetType = msgspec.UNSET  # ... and their number


def document_of(event: Event, condition_payload: Raw | None = None) -> EventDocument:
    return EventDocument(
        type="state", event_type=event.type, scope=event.scope, key=event.key,
        old_value=event.old_value, new_value=event.new_value, version=event.version,
        revision=event.revision, ts=rfc3339_ms(event.ts_ms) or "", ts_ms=event.ts_ms,
        by=event.by or None,
        condition_payload=msgspec.UNSET if condition_payload is None else condition_payload,
        tx=msgspec.UNSET if event.tx is None else event.tx,
        tx_size=msgspec.UNSET if event.tx_size is None else event.tx_size)


_document_encoder = msgspec.json.Encoder()


def document_json(event: Event, condition_payload: Raw | None = None) -> bytes:
    """The event document as compact JSON (values byte-exact as stored)."""
    return _document_encoder.encode(document_of(event, condition_payload))


class BookmarkDocument(Struct, kw_only=True):
    """A bookmark as programs see it (a watch's line): `{type: "bookmark", revision}`."""

    type: str
    revision: str


def bookmark_json(bookmark: Bookmark) -> bytes:
    return _document_encoder.encode(BookmarkDocument(type="bookmark", revision=bookmark.revision))


def revision_of(entry_id: bytes | str) -> Revision:
    """A stream id as numbers (`b"1700000000000-3"` -> (1700000000000, 3))."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def revision_text(revision: Revision) -> str:
    return f"{revision[0]}-{revision[1]}"


_REVISION_RE = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")


def parse_revision(text: str, field: str = "from_revision") -> Revision:
    """A revision a caller gives: `<ms>-<seq>` (an event's `revision`) or `<ms>` (`<ms>-0`).

    Raises InvalidRequest naming the field when it is not one, or out of a stream id's range.
    """
    if _REVISION_RE.fullmatch(text):
        revision = revision_of(text)
        if max(revision) <= MAX_SEQ:
            return revision
    raise InvalidRequest(f"{field} {shown(text[:64])} is not a revision: expected <ms>-<seq> as "
                         f"events carry it (e.g. 1700000000000-0), each part at most {MAX_SEQ}",
                         {"path": f"$.{field}"})


def fields_of(flat: list[Any]) -> dict[bytes, bytes]:
    """A stream entry's flat [name, value, ...] as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def tx_missing(entries: list[Any]) -> tuple[bytes, int] | None:
    """The transaction whose events the end of a read may have cut off: its id, and at most
    how many of its events can follow (its events are consecutive and each carries the id and
    the size; a read that began inside it counts fewer than it has, so the caller keeps only
    the entries after that still carry the id: `tx_rest`). None: the read ended outside one."""
    if not entries:
        return None
    last = fields_of(entries[-1][1])
    tx = last.get(b"tx")
    if tx is None:
        return None
    run = 0
    for _, flat in reversed(entries):
        if fields_of(flat).get(b"tx") != tx:
            break
        run += 1
    missing = int(last[b"tx_size"]) - run
    return (tx, missing) if missing > 0 else None


def tx_ends(entries: list[Any]) -> dict[str, Revision]:
    """The revision of the last entry of each transaction among `entries`, by its id."""
    ends: dict[str, Revision] = {}
    for entry_id, flat in entries:
        tx = fields_of(flat).get(b"tx")
        if tx is not None:
            ends[tx.decode()] = revision_of(entry_id)
    return ends


def tx_rest(tx: bytes, following: list[Any]) -> list[Any]:
    """The leading entries of `following` that belong to transaction `tx`."""
    rest = []
    for entry in following:
        if fields_of(entry[1]).get(b"tx") != tx:
            break
        rest.append(entry)
    return rest


def decode_event(entry_id: bytes, fields: dict[bytes, bytes]) -> Event:
    tx = fields.get(b"tx")
    tp = fields.get(b"tp")
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
        tx=None if tx is None else tx.decode(),
        tx_size=None if tx is None else int(fields[b"tx_size"]),
        traceparent=None if tp is None else tp.decode(),
    )
