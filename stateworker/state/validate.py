"""Request checks shared by the JSON functions and the typed Python API.

Every check raises a StateError whose message names the field, the problem and the limit,
before anything is written.
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec

from stateworker import codec
from stateworker.errors import InvalidRequest, KeyTooLong, ReservedScope
from stateworker.settings import Settings

# Scopes the service keeps for its own bookkeeping; no public function may name them.
RESERVED_SCOPES = frozenset({"state_barrier", "state_triggers", "state_namespaces"})
MAX_TTL_MS = 10 * 365 * 24 * 3600 * 1000  # ten years

T = TypeVar("T")
_PATH_RE = re.compile(r" - at `(\$[^`]*)`$")
_decoders: dict[type, msgspec.json.Decoder] = {}  # type: ignore[type-arg]


def request(body: bytes, type_: type[T]) -> T:
    """Decode a request body; a malformed one is INVALID_REQUEST with `details.path`."""
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        result: T = decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_RE.search(text)
        path = match.group(1) if match else "$"
        problem = _PATH_RE.sub("", text)
        if problem.startswith("Expected `object`") and path == "$":
            problem = "the request body must be a JSON object"
        raise InvalidRequest(f"{path}: {problem}", {"path": path}) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"$: the request body is not valid JSON: {exc}",
                             {"path": "$"}) from exc
    except RecursionError as exc:
        raise InvalidRequest("$: the request body is nested too deeply to read",
                             {"path": "$"}) from exc
    return result


def name(settings: Settings, field: str, text: str) -> None:
    """A scope or key: valid UTF-8 and at most `max_key_bytes` bytes."""
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"$.{field}: not valid UTF-8 text ({exc.reason})",
                             {"path": f"$.{field}"}) from exc
    if size > settings.max_key_bytes:
        raise KeyTooLong(
            f"{field} is {size} bytes, more than the limit of {settings.max_key_bytes} bytes",
            {"path": f"$.{field}", "size": size, "limit": settings.max_key_bytes},
        )


def scope(settings: Settings, text: str) -> None:
    name(settings, "scope", text)
    if text in RESERVED_SCOPES:
        raise ReservedScope(f"scope {text!r} is reserved for the service's own bookkeeping",
                            {"path": "$.scope", "scope": text})


def address(settings: Settings, scope_text: str, key_text: str) -> None:
    scope(settings, scope_text)
    name(settings, "key", key_text)


MAX_TEXT_BYTES = 1024  # topics, prefixes and patterns


def _short_text(field: str, value: str) -> None:
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"$.{field}: not valid UTF-8 text ({exc.reason})",
                             {"path": f"$.{field}"}) from exc
    if size > MAX_TEXT_BYTES:
        raise InvalidRequest(
            f"$.{field}: is {size} bytes, more than the limit of {MAX_TEXT_BYTES} bytes",
            {"path": f"$.{field}", "size": size, "limit": MAX_TEXT_BYTES})


def pattern(field: str, value: str | None) -> str | None:
    """A prefix or `*` pattern: UTF-8, at most 1024 bytes (a pattern's cost in Redis grows
    with its length)."""
    if value is not None:
        _short_text(field, value)
    return value


def ttl_ms(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_TTL_MS:
        raise InvalidRequest(f"$.ttl_ms: must be between 1 and {MAX_TTL_MS} (ten years), got {value}",
                             {"path": "$.ttl_ms"})
    return value


def expected_version(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise InvalidRequest(f"$.expected_version: must be 0 or more, got {value}",
                             {"path": "$.expected_version"})
    return value


def topic(value: str | None) -> str | None:
    """A topic: UTF-8, at most 1024 bytes, no NUL (it separates topic and key in the index)."""
    if value is not None:
        _short_text("topic", value)
        if "\0" in value:
            raise InvalidRequest("$.topic: must not contain the NUL character (\\u0000)",
                                 {"path": "$.topic"})
    return value


def value(settings: Settings, raw: msgspec.Raw, field: str = "value") -> codec.Value:
    return codec.value_from_json(bytes(raw), field, settings.max_value_bytes)
