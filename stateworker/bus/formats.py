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
from itertools import chain
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


# The check runs on the event loop for every caller's call: its Python work must not follow
# the body's values one by one (a 5 MiB body holds five million one-byte nils, or 2.6 million
# `[nil]`). `_fits` looks at the body a level at a time: each level's items gathered, their
# types taken and its floats checked finite with C loops (`chain`, `map`, `set`). Only a body
# that holds what JSON cannot is walked (`_scan`), in order, to name its first fault, and a
# path is made only for that fault.
_PLAIN = frozenset({str, int, bool, type(None), datetime.datetime})
_FINE = _PLAIN | {float}
_CONTAINED = _FINE | {dict, list}


class _Fault(Exception):
    """What JSON cannot hold, and the segments of its place, innermost first."""

    def __init__(self, problem: str, segments: list[str]) -> None:
        super().__init__(problem)
        self.problem, self.segments = problem, segments


def _fits(value: dict[Any, Any] | list[Any]) -> bool:
    """Whether JSON holds all of `value` (not empty), a level at a time (comment above).
    Raises InvalidRequest past MAX_DEPTH."""
    level: list[Any] = [value]
    for depth in range(1, MAX_DEPTH + 2):
        maps = [c for c in level if type(c) is dict]
        if maps and not set(map(type, chain.from_iterable(maps))) <= {str}:
            return False
        lists = [c for c in level if type(c) is list]
        items = lists[0] if len(level) == 1 and lists else list(chain(
            chain.from_iterable(map(dict.values, maps)), chain.from_iterable(lists)))
        kinds = set(map(type, items))
        if not kinds <= _CONTAINED or (float in kinds and not all(map(
                math.isfinite, [item for item in items if type(item) is float]))):
            return False
        if dict not in kinds and list not in kinds:
            return True
        level = [item for item in items if (type(item) is dict or type(item) is list) and item]
        if not level:
            return True
        if depth >= MAX_DEPTH:
            break
    raise InvalidRequest(f"body: nested more than {MAX_DEPTH} levels deep (the limit is "
                         f"{MAX_DEPTH})", {"path": "body", "limit": MAX_DEPTH})


def _check(value: Any, where: str, depth: int) -> None:
    try:
        if isinstance(value, dict | list):
            if value and not _fits(value):
                _scan(value, depth)
        elif (problem := _scalar_problem(value)) is not None:
            raise _Fault(problem, [])
    except _Fault as fault:
        at = _at(where + "".join(reversed(fault.segments)))
        raise InvalidRequest(f"{at}: {fault.problem}", {"path": "body", "at": at}) from None


def _scan(value: dict[Any, Any] | list[Any], depth: int) -> None:
    """Raises _Fault for the first thing in `value` (not empty) JSON cannot hold."""
    if depth + 1 > MAX_DEPTH:
        raise InvalidRequest(f"body: nested more than {MAX_DEPTH} levels deep (the limit is "
                             f"{MAX_DEPTH})", {"path": "body", "limit": MAX_DEPTH})
    is_map = isinstance(value, dict)
    items = value.values() if isinstance(value, dict) else value
    keys_ok = not is_map or set(map(type, value)) <= {str}
    kinds = set(map(type, items))
    if keys_ok and (kinds <= _PLAIN or (kinds <= _FINE and all(map(
            math.isfinite, [item for item in items if type(item) is float])))):
        return
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    for place, item in pairs:
        if is_map and type(place) is not str:
            raise _Fault(f"a map key is {type(place).__name__} {shown(str(place)[:40])}; "
                         "JSON keys are text", [])
        kind = type(item)
        if kind in _PLAIN:
            continue
        try:
            if kind is dict or kind is list:
                if item:
                    _scan(item, depth + 1)
            elif (problem := _scalar_problem(item)) is not None:
                raise _Fault(problem, [])
        except _Fault as fault:
            fault.segments.append(f".{place}" if is_map else f"[{place}]")
            raise


def _scalar_problem(value: Any) -> str | None:
    """Why JSON cannot hold this scalar (None: it can)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value} has no JSON form (a finite number is)"
    if isinstance(value, bytes | bytearray | msgspec.msgpack.Ext):
        kind = "a binary" if isinstance(value, bytes | bytearray) else "an extension value"
        return f"{kind} has no JSON form (send text, or base64 text)"
    if not isinstance(value, str | int | bool | datetime.datetime | None):
        return f"a {type(value).__name__} has no JSON form"
    return None


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
