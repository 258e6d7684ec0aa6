"""Python values <-> JSON: what the Python API (StateClient, StateStore, Worker) sends and gets.

Extended types (datetime, date, time, Decimal, UUID, bytes) travel as tagged objects, an
object with exactly the keys "$type" and "$value" (documented in docs/architecture.md for
clients in other languages), and come back as their types. NaN and the infinities are
refused: JSON has no form for them (the encoder would write null). The exact JSON itself, the
canonical form and the hash are codec.py's.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import math
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from stateworker.codec import (
    DEPTH_MESSAGE,
    MAX_DEPTH,
    Value,
    decode_exact,
    encode_compact,
    value_from_tree,
)
from stateworker.errors import InvalidRequest

# A tagged value is an object with exactly the keys "$type" and "$value" (documented in
# docs/architecture.md for clients in other languages).
# The Python API's "no value given" (compare_and_set's `expected`: the key must be absent;
# get_entry's `default`: none), apart from None, which is the JSON value null.
ABSENT: Any = msgspec.UNSET

TYPE_KEY = "$type"
VALUE_KEY = "$value"


def to_json_tree(value: Any) -> Any:
    """Python value -> JSON-ready tree, extended types replaced by their tagged objects. NaN
    and the infinities are refused (JSON has no form for them; the encoder would write null)."""
    if value is None or isinstance(value, str | bool | int | msgspec.Raw):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise InvalidRequest(f"$.value: {value} has no JSON form (a finite number has)",
                             {"path": "$.value"})
    if isinstance(value, dict):
        return {_key(k): to_json_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_tree(v) for v in value]
    return _tag(value)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise InvalidRequest(f"object keys must be strings, got {type(key).__name__}",
                             {"path": "$.value"})
    return key


def _tag(value: Any) -> dict[str, str]:
    if isinstance(value, dt.datetime):
        return {TYPE_KEY: "datetime", VALUE_KEY: value.isoformat()}
    if isinstance(value, dt.date):
        return {TYPE_KEY: "date", VALUE_KEY: value.isoformat()}
    if isinstance(value, dt.time):
        return {TYPE_KEY: "time", VALUE_KEY: value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {TYPE_KEY: "decimal", VALUE_KEY: str(value)}
    if isinstance(value, uuid.UUID):
        return {TYPE_KEY: "uuid", VALUE_KEY: str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {TYPE_KEY: "bytes", VALUE_KEY: base64.b64encode(bytes(value)).decode()}
    raise InvalidRequest(f"value of type {type(value).__name__} cannot be stored as JSON",
                         {"path": "$.value"})


_UNTAG: dict[str, Callable[[str], Any]] = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "decimal": decimal.Decimal,
    "uuid": uuid.UUID,
    "bytes": lambda text: base64.b64decode(text, validate=True),  # (not "!!" read as b"")
}


def from_json_tree(tree: Any) -> Any:
    """Decoded JSON tree -> Python value, tagged objects turned back into their types.

    Numbers kept as text (`msgspec.Raw`) become floats; read the JSON text for exact digits.
    A tag whose `$value` is no such value (`{"$type": "decimal", "$value": "x"}`, written by
    any caller in any language) stays the object it is: read as a raw Python exception, it
    made every Python reader of the key, a listing of its scope and a Worker handed the
    value fail.
    """
    if isinstance(tree, dict):
        if len(tree) == 2 and isinstance(tree.get(TYPE_KEY), str) and VALUE_KEY in tree:
            convert = _UNTAG.get(tree[TYPE_KEY])
            if convert is not None and isinstance(tree[VALUE_KEY], str):
                with contextlib.suppress(ValueError, ArithmeticError):  # (decimal's is one)
                    return convert(tree[VALUE_KEY])
        return {k: from_json_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [from_json_tree(v) for v in tree]
    if isinstance(tree, msgspec.Raw):
        return float(bytes(tree))
    return tree


def decode_value(text: bytes | None) -> Any:
    """Stored JSON text (None: missing) -> Python value."""
    return None if text is None else from_json_tree(decode_exact(text))


def encode_tree(value: Any) -> bytes:
    """A Python value (extended types allowed) as JSON text: a request body as sent. Refused
    (INVALID_REQUEST): what has no JSON form, and nesting deeper than Python's stack, with
    the values' limit named (the service refuses values deeper than MAX_DEPTH anyway)."""
    try:
        return encode_compact(to_json_tree(value))
    except RecursionError as exc:
        raise InvalidRequest(f"$.value: {DEPTH_MESSAGE}", {"path": "$.value",
                                                          "limit": MAX_DEPTH}) from exc


def encode_plain(value: Any) -> bytes:
    """Plain JSON values (dicts, lists, str, numbers ...) as JSON text, no types tagged; NaN
    and the infinities refused, as `to_json_tree` does (the encoder writes them as null, so
    only a text holding a null is looked through)."""
    text = encode_compact(value)
    if b"null" in text:
        _check_finite(value)
    return text


def _check_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        to_json_tree(value)  # (raises, naming it)
    elif isinstance(value, dict):
        for item in value.values():
            _check_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_finite(item)


def encode_value(value: Any, field: str, max_bytes: int) -> Value:
    """Python value (extended types allowed) -> validated stored JSON."""
    try:
        tree = to_json_tree(value)
    except RecursionError as exc:  # Python's own stack is the limit here, below MAX_DEPTH
        raise InvalidRequest(f"$.{field}: {DEPTH_MESSAGE}",
                             {"path": f"$.{field}", "limit": MAX_DEPTH}) from exc
    return value_from_tree(tree, field, max_bytes)
