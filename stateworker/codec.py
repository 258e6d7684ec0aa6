"""JSON that keeps its digits, the canonical form and hash (the Python API's values and their
tagged extended types: pyvalues.py).

Values travel as JSON text and are stored as compact JSON text. Decoding keeps every
non-integer number as its original text (`msgspec.Raw` from `float_hook`), integers decode
to exact Python ints, so re-encoding writes every number exactly as it came, keeps `[]`/`{}`
and object key order. The canonical form (docs/architecture.md, "Canonical hash") is the
same tree encoded with sorted keys and Go's string escaping, and `hash` is its SHA-256.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from stateworker.errors import InvalidRequest, StateError, ValueTooLarge

# msgspec reads the integer `-0` as 0. Before decoding, an integer `-0` outside strings is
# rewritten to this float text, which the float hook turns back into `-0` (a document that
# spells this very float gets `-0`: the same number).
_NEG_ZERO_MARK = "-0e-00000000000000000000000000000000"
_STRING_RE = rb'"[^"\\]*(?:\\.[^"\\]*)*"'  # one JSON string (unrolled: no per-byte alternation)
_NEG_ZERO = re.compile(_STRING_RE + rb"|(?<![0-9eE.])-0(?![0-9.eE])")


def _float_hook(text: str) -> msgspec.Raw:
    return msgspec.Raw(b"-0" if text == _NEG_ZERO_MARK else text.encode())


def _mark_negative_zero(match: re.Match[bytes]) -> bytes:
    token = match.group(0)
    return _NEG_ZERO_MARK.encode() if token == b"-0" else token


_decoder = msgspec.json.Decoder(float_hook=_float_hook)
_compact = msgspec.json.Encoder()
_sorted = msgspec.json.Encoder(order="sorted")

# msgspec writes \b and \f as short escapes and leaves < > & U+2028 U+2029 raw; Go (and the
# canonical form) writes them as \u escapes. An escape pair is matched as a whole, so the `b`
# of an escaped backslash followed by `b` is never mistaken for `\b`.
_GO_ESCAPES = re.compile(rb"\\[bf\\]|[<>&]|\xe2\x80[\xa8\xa9]")
_GO_REPLACEMENTS = {
    b"\\b": b"\\u0008",
    b"\\f": b"\\u000c",
    b"\\\\": b"\\\\",
    b"<": b"\\u003c",
    b">": b"\\u003e",
    b"&": b"\\u0026",
    b"\xe2\x80\xa8": b"\\u2028",
    b"\xe2\x80\xa9": b"\\u2029",
}


def _go_escape(match: re.Match[bytes]) -> bytes:
    return _GO_REPLACEMENTS[match.group(0)]


_NUMBER_BYTES = frozenset(b"0123456789.eE")


def _may_hold_negative_zero(text: bytes) -> bool:
    """Whether `-0` stands anywhere as a whole number (maybe inside a string): a cheap scan."""
    at = text.find(b"-0")
    while at >= 0:
        before = text[at - 1] if at > 0 else 0
        after = text[at + 2] if at + 2 < len(text) else 0
        if before not in _NUMBER_BYTES and after not in _NUMBER_BYTES:
            return True
        at = text.find(b"-0", at + 2)
    return False


MAX_DEPTH = 512  # containers nested in a value, at most (the decoder recurses)
MAX_INT_DIGITS = 4300  # digits of an integer, at most (Python's int_max_str_digits)
class LimitExceeded(ValueError):
    """Raised when valid JSON is beyond what values may hold (depth, integer digits)."""

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


DEPTH_MESSAGE = f"nested more than {MAX_DEPTH} levels deep (the limit is {MAX_DEPTH})"
_BRACKETS = re.compile(rb"[\[\]{}]")


def check_depth(text: bytes) -> None:
    """Values written are at most MAX_DEPTH deep (update ops may add their path's 32 levels;
    the decoder reads about twice as deep). Only text with that many brackets can be that
    deep, so the exact walk runs rarely."""
    if text.count(b"[") + text.count(b"{") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:
        raise LimitExceeded(DEPTH_MESSAGE, MAX_DEPTH)


def nesting_depth(text: bytes) -> int:
    """The deepest container nesting of JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub(b"", text)):
        if match.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def decode_exact(text: bytes | str) -> Any:
    """Decode JSON, keeping non-integer numbers as `msgspec.Raw` text; raises ValueError
    (LimitExceeded for an integer longer than MAX_INT_DIGITS, or nesting deeper than the
    decoder can go: about twice MAX_DEPTH, so whatever was written can be read)."""
    if isinstance(text, str):
        text = text.encode()
    if _may_hold_negative_zero(text):
        text = _NEG_ZERO.sub(_mark_negative_zero, text)
    try:
        return _decoder.decode(text)
    except RecursionError as exc:
        raise LimitExceeded(DEPTH_MESSAGE, MAX_DEPTH) from exc
    except (msgspec.DecodeError, ValueError) as exc:
        if "Integer value out of range" in str(exc):
            raise LimitExceeded(f"an integer has more than {MAX_INT_DIGITS} digits (the limit "
                                f"is {MAX_INT_DIGITS}; write longer numbers as strings)",
                                MAX_INT_DIGITS) from exc
        raise ValueError(str(exc)) from exc


def encode_compact(tree: Any) -> bytes:
    """Compact JSON of a decoded tree (numbers kept as text come out as they went in)."""
    return _compact.encode(tree)


def canonical(tree: Any) -> bytes:
    """The canonical JSON of a decoded tree: sorted keys, Go escaping, numbers as written."""
    raw = _sorted.encode(tree)
    if b"\\" in raw or b"<" in raw or b">" in raw or b"&" in raw or b"\xe2\x80" in raw:
        raw = _GO_ESCAPES.sub(_go_escape, raw)
    return raw


def hash_tree(tree: Any) -> str:
    return hashlib.sha256(canonical(tree)).hexdigest()


class Value(msgspec.Struct, frozen=True):
    """A validated value: its compact stored JSON and its canonical hash."""

    json: bytes
    hash: str

    @property
    def plain_strings(self) -> bool:
        # Small documents parse fast anyway; the check is not worth its cost for them.
        return len(self.json) >= PLAIN_CHECK_MIN_BYTES and plain_strings(self.json)


_STRING = re.compile(_STRING_RE)
PLAIN_CHECK_MIN_BYTES = 256


def plain_strings(compact: bytes) -> bool:
    """True when no string in the JSON holds a bracket or brace, so the Lua codec may find
    the end of a container with a balanced match (see lua/includes/json.lua)."""
    if b'"' not in compact:
        return True
    brackets = len(compact) - len(compact.translate(None, b"[]{}"))
    if brackets == 0:
        return True
    without_strings = _STRING.sub(b"", compact)
    return brackets == len(without_strings) - len(without_strings.translate(None, b"[]{}"))


def value_from_tree(tree: Any, field: str, max_bytes: int) -> Value:
    """Compact JSON and hash of a tree; VALUE_TOO_LARGE names the field, size and limit."""
    return Value(compact_from_tree(tree, field, max_bytes), hash_tree(tree))


def compact_from_tree(tree: Any, field: str, max_bytes: int) -> bytes:
    """Compact JSON of a tree; VALUE_TOO_LARGE names the field, size and limit."""
    try:
        compact = _compact.encode(tree)
    except RecursionError as exc:
        raise InvalidRequest(f"$.{field}: {DEPTH_MESSAGE}",
                             {"path": f"$.{field}", "limit": MAX_DEPTH}) from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"$.{field}: cannot be encoded as JSON: {exc}",
                             {"path": f"$.{field}"}) from exc
    try:
        check_depth(compact)
    except LimitExceeded as exc:
        raise InvalidRequest(f"$.{field}: {exc}", {"path": f"$.{field}", "limit": exc.limit}
                             ) from exc
    if len(compact) > max_bytes:
        raise ValueTooLarge(
            f"{field} is {len(compact)} bytes of JSON, more than the limit of {max_bytes} bytes",
            {"path": f"$.{field}", "size": len(compact), "limit": max_bytes},
        )
    return compact


def value_from_json(text: bytes, field: str, max_bytes: int) -> Value:
    """Validate JSON text from a request and give its compact form and hash."""
    return value_from_tree(tree_from_json(text, field, max_bytes), field, max_bytes)


def canonical_value_from_json(text: bytes, field: str, max_bytes: int) -> Value:
    """Validate JSON text from a request; its canonical form is what is kept (Dagu's
    normalized value), so the hash is that text's SHA-256. Decoded once."""
    canonical_text = canonical(tree_from_json(text, field, max_bytes))
    if len(canonical_text) > max_bytes:
        raise ValueTooLarge(
            f"{field} is {len(canonical_text)} bytes of JSON, more than the limit of "
            f"{max_bytes} bytes",
            {"path": f"$.{field}", "size": len(canonical_text), "limit": max_bytes})
    return Value(canonical_text, hashlib.sha256(canonical_text).hexdigest())


# ---- lone surrogates: JSON that no Unicode text can hold ------------------------------------
# A string escape `\ud800` (a high surrogate) must be followed by a low one (`\udc00`):
# together they are one character. Alone, it is no character at all, and the decoder's error
# says only "Input data was truncated". Escapes are read in order, so `\\ud800` (an escaped
# backslash, then the text `ud800`) is no escape.
_ESCAPE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
                     rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\.")
_LONE_MARK = b"\\u0000\\u0001lone surrogate\\u0001"  # where the first one stood, to find it


def surrogate_error(text: bytes, root: str) -> InvalidRequest | None:
    """INVALID_REQUEST naming where JSON text holds a lone UTF-16 surrogate escape (its path
    below `root`, the escape and why), or None when it holds none."""
    lone = [m.span(1) for string in _STRING.finditer(text) for m in _ESCAPE.finditer(
        text, string.start(), string.end()) if m.group(1)]
    if not lone:
        return None
    escape = text[lone[0][0]:lone[0][1]].decode()
    pieces, at = [], 0
    for index, (start, end) in enumerate(lone):  # the first marked, the others made harmless
        pieces += [text[at:start], _LONE_MARK if index == 0 else b"?"]
        at = end
    try:
        path = root + (_marked_path(decode_exact(b"".join(pieces) + text[at:]), escape) or "")
    except ValueError:  # (malformed besides: the escape is still what is named)
        path = root
    kind = "high surrogate without the low one after it" if escape[3].lower() in "89ab" \
        else "low surrogate without a high one before it"
    return InvalidRequest(
        f"{path}: holds a lone UTF-16 surrogate `{escape}` (a {kind}), which is "
        "no character: write the character itself (UTF-8) or both halves of its pair "
        "(\\ud83d\\ude00 is one emoji)", {"path": path, "escape": escape})


_MARK_TEXT = "\x00\x01lone surrogate\x01"  # _LONE_MARK decoded
_MARK_JSON = _compact.encode(_MARK_TEXT)[1:-1].decode()  # and encoded again
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _marked_path(tree: Any, escape: str) -> str | None:
    """The path (`.a[1]`, `["a b"]`) of the string or key holding the mark, or None; a key
    is shown with the escape where the mark stands."""
    if isinstance(tree, str):
        return "" if _MARK_TEXT in tree else None
    if isinstance(tree, list):
        for index, item in enumerate(tree):
            found = _marked_path(item, escape)
            if found is not None:
                return f"[{index}]{found}"
    if isinstance(tree, dict):
        for key, item in tree.items():
            if _MARK_TEXT in key:
                return f"[{_compact.encode(key).decode().replace(_MARK_JSON, escape)}]"
            found = _marked_path(item, escape)
            if found is not None:
                return (f".{key}" if _NAME.fullmatch(key) else
                        f"[{_compact.encode(key).decode()}]") + found
    return None


def tree_from_json(text: bytes, field: str, max_bytes: int) -> Any:
    """Request JSON decoded exactly, after the size and depth checks (naming `field`)."""
    if len(text) > 4 * max_bytes + 1024:  # far too large even before compaction
        raise ValueTooLarge(
            f"{field} is {len(text)} bytes of JSON, more than the limit of {max_bytes} bytes",
            {"path": f"$.{field}", "size": len(text), "limit": max_bytes},
        )
    try:
        check_depth(text)
        tree = decode_exact(text)
    except LimitExceeded as exc:
        raise InvalidRequest(f"$.{field}: {exc}", {"path": f"$.{field}", "limit": exc.limit}
                             ) from exc
    except ValueError as exc:
        raise surrogate_error(text, f"$.{field}") or InvalidRequest(
            f"$.{field}: not valid JSON: {exc}", {"path": f"$.{field}"}) from exc
    return tree


def whole_number(text: str, most_digits: int = 18) -> int | None:
    """The value of a text of ASCII digits, at most `most_digits` of them; None for any other
    text. (`str.isdigit` takes other scripts' digits and superscripts, which `int` refuses,
    and `int` refuses more than 4,300 digits: a caller's text checked so cannot crash.)"""
    if not (0 < len(text) <= most_digits and text.isascii() and text.isdigit()):
        return None
    return int(text)


def sized_text(field: str, text: str, limit: int,
               too_long: type[StateError] = InvalidRequest) -> None:
    """The one UTF-8-and-size check: valid UTF-8 and at most `limit` bytes."""
    try:
        size = len(text.encode())
    except UnicodeEncodeError as exc:
        raise InvalidRequest(f"$.{field}: not valid UTF-8 text ({exc.reason})",
                             {"path": f"$.{field}"}) from exc
    if size > limit:
        raise too_long(f"{field} is {size} bytes, more than the limit of {limit} bytes",
                       {"path": f"$.{field}", "size": size, "limit": limit})
