"""A msgpack body's check for what JSON cannot hold (bus/formats.py) runs on the service's
event loop, for every call of every caller: its Python-level work must not grow with the
body's scalars. A 5 MiB body of nils, small integers or empty maps (one byte each) once made
five million Python calls, about six seconds in which no other call was served (the
partition leases were lost)."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import msgspec
import pytest

from stateworker.bus import formats
from stateworker.errors import InvalidRequest

N = 200_000  # elements of one byte each


def _array(element: bytes, n: int = N) -> bytes:
    return (b"\x83\xa5scope\xa1s\xa3key\xa1k\xa5value\xdd" + n.to_bytes(4, "big")
            + element * n)


def python_calls(body: bytes) -> int:
    """How many Python functions of bus/formats.py body_json calls (itself included)."""
    calls = 0

    def profile(frame: FrameType, event: str, _: Any) -> None:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename == formats.__file__:
            calls += 1

    sys.setprofile(profile)
    try:
        formats.body_json(body)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("element", [b"\xc0", b"\x07", b"\xa0", b"\xc3", b"\x80", b"\x90",
                                     b"\xcb" + msgspec.msgpack.encode(1.5)[1:]])
def test_a_wide_body_costs_python_work_by_its_containers_not_its_elements(
        element: bytes) -> None:
    assert python_calls(_array(element)) < 100


@pytest.mark.parametrize(("body", "message"), [
    (_array(b"\xc0", 10) + b"", None),
    (b"\x81\xa1a" + b"\x93\xc0\xc0" + b"\xcb" + msgspec.msgpack.encode(float("nan"))[1:],
     "body.a[2]: nan has no JSON form (a finite number is)"),
    (b"\x81\xa1a\x92\x80\x81\x01\x02", "body.a[1]: a map key is int \"1\"; JSON keys are text"),
    (b"\x81\xa1a\x92\x90\x91\xc4\x01x", "body.a[1][0]: a binary has no JSON form (send text, "
     "or base64 text)"),
    (msgspec.msgpack.encode({"a": [1, {"b": [None, msgspec.msgpack.Ext(1, b"")]}]}),
     "body.a[1].b[1]: an extension value has no JSON form (send text, or base64 text)"),
    (b"\x91" * 600 + b"\xc0", "body: nested more than 512 levels deep (the limit is 512)"),
])
def test_what_json_cannot_hold_is_still_named_where_it_is(body: bytes,
                                                          message: str | None) -> None:
    if message is None:
        assert formats.body_json(body).startswith(b'{"scope":"s"')
        return
    with pytest.raises(InvalidRequest) as raised:
        formats.body_json(body)
    assert str(raised.value) == message
