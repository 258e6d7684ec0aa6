"""An entry's stored form, read and written in Python: one Redis string, a packed head and
then the value's JSON text (scripts/lua/includes/packed.lua has the layout and is the other
writer; tests/lua/test_packed.py holds the two together). The snapshot reads entries with it
and the restore writes them."""

from __future__ import annotations

import struct

import msgspec

PLAIN, EXPIRES, TOPIC, WRITER, HASH, WIDE = 1, 2, 4, 8, 16, 32
_NARROW = struct.Struct(">B3s6s6s2s2s")  # flags, version, created, updated, rev ms - updated, seq
_WIDE = struct.Struct(">B6s6s6s6s4s")
_LENGTH = struct.Struct(">H")
_NARROW_LIMITS = (1 << 24, 1 << 15, 1 << 16)  # version, |revision ms - updated|, sequence


class Stored(msgspec.Struct):
    """One entry as stored. Times are epoch ms; `revision` is the stream id of its last event."""

    value: bytes
    version: int
    created: int
    updated: int
    revision: tuple[int, int]  # (ms, sequence)
    hash: str | None = None  # lowercase hex SHA-256 (None: unknown, an update's)
    expires: int | None = None
    topic: str | None = None
    by: str | None = None
    plain: bool = False


def _int(raw: bytes, signed: bool = False) -> int:
    return int.from_bytes(raw, "big", signed=signed)


def unpack(stored: bytes) -> Stored:
    """The entry a stored string holds."""
    flags = stored[0]
    head = _WIDE if flags & WIDE else _NARROW
    _, version, created, updated, rev_ms, seq = head.unpack_from(stored)
    at = head.size
    entry = Stored(b"", _int(version), _int(created), _int(updated), (0, _int(seq)),
                   plain=bool(flags & PLAIN))
    entry.revision = (entry.updated + _int(rev_ms, signed=True), entry.revision[1])
    if flags & HASH:
        entry.hash, at = stored[at:at + 32].hex(), at + 32
    if flags & EXPIRES:
        entry.expires, at = _int(stored[at:at + 6]), at + 6
    if flags & TOPIC:
        entry.topic, at = _text(stored, at)
    if flags & WRITER:
        entry.by, at = _text(stored, at)
    entry.value = stored[at:]
    return entry


def _text(stored: bytes, at: int) -> tuple[str, int]:
    (length,) = _LENGTH.unpack_from(stored, at)
    at += _LENGTH.size
    return stored[at:at + length].decode(), at + length


def _part(text: str) -> bytes:
    raw = text.encode()
    return _LENGTH.pack(len(raw)) + raw


def pack(entry: Stored) -> bytes:
    """The stored string of an entry, as the scripts write it (the narrow head when every
    number fits)."""
    rev_ms, seq = entry.revision
    delta = rev_ms - entry.updated
    flags = ((PLAIN if entry.plain else 0) | (EXPIRES if entry.expires is not None else 0)
             | (TOPIC if entry.topic is not None else 0) | (WRITER if entry.by else 0)
             | (HASH if entry.hash else 0))
    versions, deltas, seqs = _NARROW_LIMITS
    narrow = entry.version < versions and -deltas <= delta < deltas and seq < seqs
    sizes = (3, 2, 2) if narrow else (6, 6, 4)
    parts = [bytes([flags if narrow else flags | WIDE]),
             entry.version.to_bytes(sizes[0], "big"), entry.created.to_bytes(6, "big"),
             entry.updated.to_bytes(6, "big"), delta.to_bytes(sizes[1], "big", signed=True),
             seq.to_bytes(sizes[2], "big")]
    if entry.hash:
        parts.append(bytes.fromhex(entry.hash))
    if entry.expires is not None:
        parts.append(entry.expires.to_bytes(6, "big"))
    if entry.topic is not None:
        parts.append(_part(entry.topic))
    if entry.by:
        parts.append(_part(entry.by))
    parts.append(entry.value)
    return b"".join(parts)
