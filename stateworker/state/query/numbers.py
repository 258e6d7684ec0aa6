"""Exact JSON numbers for `state::query` (pure code; the conditions are predicates.py's).

A condition's numbers are decoded as `Number` (`decode`: a request's `where`, small); a stored
document is decoded in C (`decode_doc`: integers as Python ints, other numbers as their text
in bytes, `NumberText`) and only what a condition compares is made exact. `order` compares two
numbers of either side. What it costs is bounded by the stored text, read at most once an entry (`memo`),
never by how often the conditions compare it: a `Number` keeps its digits as text, compared in
C (a tuple of digits took 300 ms to make from a 1 MB number), and an int is compared with a
condition's number without being written in decimal (a 4,300-digit int takes about 0.35 ms
to write, and was written again for each condition of each entry).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import msgspec

_NUMBER = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?(?:[eE]([-+]?[0-9]+))?")
MAX_EXPONENT_DIGITS = 4000  # (Python's int parses 4300 digits; beyond: clamped, not exact)
# The digits of an int decode_doc gives, at most (msgspec's, Python's int_max_str_digits): a
# longer integer comes as NumberText.
INT_DIGITS = 4300
_FLIP = str.maketrans("0123456789", "9876543210")


@functools.total_ordering
class Number:
    """A JSON number, exactly: 0.<digits> * 10^point, negative or not (digits without leading
    or trailing zeros; none for zero, so -0 is 0). Any exponent (Decimal refuses those past
    10^18); ordered and compared by value."""

    __slots__ = ("_floor", "digits", "key", "negative", "point")

    def __init__(self, text: str) -> None:
        match = _NUMBER.fullmatch(text)
        if match is None:
            raise ValueError(f"not a JSON number: {text[:40]}")
        sign, whole, frac, exp = match.groups()
        digits = whole + (frac or "")
        significant = digits.lstrip("0")
        if exp and len(exp.lstrip("+-").lstrip("0")) > MAX_EXPONENT_DIGITS:
            exp = ("-" if exp.startswith("-") else "") + "9" * MAX_EXPONENT_DIGITS
        self.negative = bool(sign) and bool(significant)
        self.point = len(whole) + int(exp or 0) - (len(digits) - len(significant))
        self.digits = significant.rstrip("0")
        self._floor: tuple[int, bool] | None = None
        if not self.digits:
            self.key: tuple[Any, ...] = (1,)
        elif self.negative:  # (flipped digits and a terminator above them, ':' after '9':
            # the order reversed)
            self.key = (0, -self.point, self.digits.translate(_FLIP) + ":")
        else:
            self.key = (2, self.point, self.digits)

    def floor(self) -> tuple[int, bool]:
        """The greatest integer at most this number, and whether it is this number; only for
        a point within INT_DIGITS (`int_order` decides the rest by magnitude)."""
        if self._floor is None:
            point, digits = self.point, self.digits
            whole = int(digits[:point]) * 10 ** max(0, point - len(digits)) if point > 0 else 0
            exact = len(digits) <= point
            if self.negative:
                whole = -whole if exact else -whole - 1
            self._floor = (whole, exact)
        return self._floor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Number) and self.key == other.key

    def __lt__(self, other: Number) -> bool:
        return self.key < other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Number({'-' if self.negative else ''}0.{self.digits or 0}e{self.point})"


def _refuse(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def decode(text: bytes | str) -> Any:
    """A JSON document with every number as an exact Number (a condition's value: small)."""
    return json.loads(text, parse_float=Number, parse_int=Number, parse_constant=_refuse)


# A stored number that is not an integer, as decode_doc gives it: its text, as bytes (nothing
# else of a decoded document is bytes), made a Number when a condition compares it. Bytes, not
# a str subclass: str.encode is a call in C, and the subclass took 5 times as long to make
# (152 ms for a 1 MB value of `1e1`, now 31).
NumberText = bytes

_DOC = msgspec.json.Decoder(float_hook=str.encode)


def decode_in_c(text: bytes) -> Any:
    """decode_doc without its way round an integer of more than INT_DIGITS digits (a Python
    call per number): raises msgspec.DecodeError for one."""
    return _DOC.decode(text)


def decode_doc(text: bytes) -> Any:
    """A stored value for the conditions: decoded in C (no Python call per integer: a 1 MiB
    value of numbers once took ~2 s of the event loop), its numbers exact: ints (Python's,
    exact) and NumberText; `exact` makes what a condition compares a Number."""
    try:
        return _DOC.decode(text)
    except msgspec.DecodeError:  # (an integer past what msgspec parses: each kept as text)
        return json.loads(text, parse_float=str.encode, parse_int=str.encode,
                          parse_constant=_refuse)


# What decoding a stored value costs a query page's byte budget (query.Page): its bytes, and
# NUMBER_TEXT_BYTES more for each '.', 'e' or 'E' in it: a number that is not an integer is
# an object more in decode_doc (about 0.12 µs: the cost of 16 bytes of integers). A page of
# 8 MiB of `1e1` held the service's loop 1.3 s.
NUMBER_TEXT_BYTES = 16


def decode_cost(text: bytes) -> int:
    return len(text) + NUMBER_TEXT_BYTES * (text.count(b".") + text.count(b"e") +
                                            text.count(b"E"))


def exact(value: Any, memo: dict[int, Number] | None = None) -> Any:
    """A scalar of decode_doc as decode gives it (an int or NumberText: a Number). `memo`:
    the Numbers made of one document's texts so far (by the text's id, which lives as long
    as the document): each is read once however many conditions compare it."""
    if isinstance(value, NumberText):
        if memo is None:
            return Number(value.decode())
        made = memo.get(id(value))
        if made is None:
            made = memo[id(value)] = Number(value.decode())
        return made
    if isinstance(value, int) and not isinstance(value, bool):
        return Number(str(value))
    return value


def int_order(found: int, number: Number) -> int:
    """-1, 0 or 1 as an int of decode_doc (at most INT_DIGITS digits) is below, equal to or
    above `number`, never written in decimal."""
    if not number.digits:
        return (found > 0) - (found < 0)
    if number.point > INT_DIGITS:  # (|number| >= 10^INT_DIGITS > |found|)
        return 1 if number.negative else -1
    whole, exact_whole = number.floor()
    if found != whole:
        return 1 if found > whole else -1
    return 0 if exact_whole else -1


def order(a: Any, b: Any, memo: dict[int, Number] | None = None) -> int:
    """-1, 0 or 1 as the number `a` is below, equal to or above the number `b` (each an int,
    a NumberText or a Number)."""
    if type(a) is int:
        return (a > b) - (a < b) if type(b) is int else int_order(a, exact(b, memo))
    if type(b) is int:
        return -int_order(b, exact(a, memo))
    x: tuple[Any, ...] = exact(a, memo).key
    y: tuple[Any, ...] = exact(b, memo).key
    return (x > y) - (x < y)
