"""msgpack bodies (docs/bus-protocol.md, "msgpack bodies"): a call entry with `fmt msgpack`
has a msgpack body and gets a msgpack reply document. Inside, a call is JSON text as ever:
the body is turned into JSON once when the entry is read (what a JSON caller would have sent
for the same value), and the reply document into msgpack when it is queued, so scripts,
records and replays see one form.

What has no JSON form is refused (INVALID_REQUEST naming `body` and where): a binary or an
extension value (a msgpack timestamp is a datetime, written as RFC 3339 text), a map key that
is not text, NaN and the infinities. A reply's number that msgpack cannot hold (an integer
beyond 64 bits) is sent as its decimal text."""

from __future__ import annotations

import datetime
import math
from typing import Any

import msgspec

from stateworker.codec import MAX_DEPTH
from stateworker.errors import InvalidRequest, shown

JSON, MSGPACK = b"json", b"msgpack"

_unpack = msgspec.msgpack.Decoder()
_pack = msgspec.msgpack.Encoder()


def _float(text: str) -> float | str:
    """A JSON number with a fraction or exponent, for a msgpack reply: a float, or its text
    when it is beyond a double's range (`1e999999`, which a value keeps exactly)."""
    number = float(text)
    return number if math.isfinite(number) else text


_from_json = msgspec.json.Decoder(float_hook=_float)
_to_json = msgspec.json.Encoder()
_MSGPACK_INTS = (-(1 << 63), (1 << 64) - 1)


def is_msgpack(fmt: bytes | None) -> bool:
    """The entry's `fmt` (None: absent, JSON). Raises InvalidRequest for another format."""
    if fmt is None or fmt == JSON:
        return False
    if fmt == MSGPACK:
        return True
    raise InvalidRequest(
        f"fmt: must be json or msgpack, got {shown(fmt[:40].decode(errors='replace'))}",
        {"path": "fmt", "allowed": ["json", "msgpack"]})


def body_json(raw: bytes) -> bytes:
    """A msgpack body as the JSON text of the same value. Raises InvalidRequest (path `body`)
    for a body that is no msgpack, or holds what JSON cannot."""
    try:
        value = _unpack.decode(raw)
    except RecursionError as exc:  # (deeper than the decoder goes: past MAX_DEPTH anyway)
        raise InvalidRequest(f"body: nested more than {MAX_DEPTH} levels deep (the limit is "
                             f"{MAX_DEPTH})", {"path": "body", "limit": MAX_DEPTH}) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body: not valid msgpack (fmt msgpack): {exc}",
                             {"path": "body"}) from exc
    _check(value, "body", 0)
    return _to_json.encode(value)


def _at(where: str) -> str:
    """A place in the body, as errors name it (a long path cut: a message stays short)."""
    return where if len(where) <= 200 else where[:200] + "..."


def _check(value: Any, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"body: nested more than {MAX_DEPTH} levels deep (the limit is "
                             f"{MAX_DEPTH})", {"path": "body", "limit": MAX_DEPTH})
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"{_at(where)}: a map key is {type(key).__name__} "
                                     f"{shown(str(key)[:40])}; JSON keys are text",
                                     {"path": "body", "at": _at(where)})
            _check(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{_at(where)}: {value} has no JSON form (a finite number is)",
                             {"path": "body", "at": _at(where)})
    elif isinstance(value, bytes | bytearray | msgspec.msgpack.Ext):
        kind = "a binary" if isinstance(value, bytes | bytearray) else "an extension value"
        raise InvalidRequest(f"{_at(where)}: {kind} has no JSON form (send text, or base64 "
                             "text)", {"path": "body", "at": _at(where)})
    elif not isinstance(value, str | int | float | bool | datetime.datetime | None):
        raise InvalidRequest(f"{_at(where)}: a {type(value).__name__} has no JSON form",
                             {"path": "body", "at": _at(where)})


def reply_msgpack(document: bytes) -> bytes:
    """A JSON reply document as msgpack (the same map: id, ok, result or error)."""
    value = _from_json.decode(document)
    try:
        return _pack.encode(value)
    except OverflowError:
        return _pack.encode(_wide_as_text(value))


def _wide_as_text(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _wide_as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_wide_as_text(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not (
            _MSGPACK_INTS[0] <= value <= _MSGPACK_INTS[1]):
        return str(value)
    return value
