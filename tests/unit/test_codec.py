"""Codec: exact JSON, the canonical form and hash, and the tagged Python types."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateworker import clock, codec, pyvalues
from stateworker.errors import InvalidRequest, ValueTooLarge
from tests.jsontext import Obj, deep, exact_load, json_trees, reference_canonical, to_text


def test_known_dagu_hash() -> None:
    value = codec.value_from_json(b'{"last_id": 123}', "value", 100)
    assert value.hash == "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
    assert value.json == b'{"last_id":123}'


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        (b'{"b":1,"a":[]}', b'{"a":[],"b":1}'),
        (b'"<a&b>"', b'"\\u003ca\\u0026b\\u003e"'),
        (b'"\\u2028\\u2029"', b'"\\u2028\\u2029"'),
        (b'"\\b\\f\\u0001"', b'"\\u0008\\u000c\\u0001"'),
        (b'"\\\\b"', b'"\\\\b"'),
        (b'"\\n\\r\\t\\"\\\\/"', b'"\\n\\r\\t\\"\\\\/"'),
        (b'{"a":1,"a":2}', b'{"a":2}'),
        (b'[1.2300, 1e2, 1E+2, -0.0]', b"[1.2300,1e2,1E+2,-0.0]"),
        (b'{"\xc3\xa9":1,"z":2,"\xf0\x9f\x98\x80":3}',
         b'{"z":2,"\xc3\xa9":1,"\xf0\x9f\x98\x80":3}'),
    ],
)
def test_canonical_examples(text: bytes, canonical: bytes) -> None:
    assert codec.canonical(codec.decode_exact(text)) == canonical


@settings(max_examples=300)
@given(json_trees, st.sampled_from(["", " ", "\n  "]))
def test_compact_form_keeps_every_digit_and_kind(tree: Any, space: str) -> None:
    value = codec.value_from_json(to_text(tree, space).encode(), "value", 10**6)
    assert exact_load(value.json) == exact_load(to_text(tree))
    assert b" " not in value.json or " " in to_text(tree)  # only string contents keep spaces


@settings(max_examples=300)
@given(json_trees)
def test_hash_matches_reference_canonical_form(tree: Any) -> None:
    value = codec.value_from_json(to_text(tree).encode(), "value", 10**6)
    assert codec.canonical(codec.decode_exact(value.json)) == reference_canonical(tree)


def test_deep_nesting_round_trips() -> None:
    tree = deep(200)
    value = codec.value_from_json(to_text(tree).encode(), "value", 10**6)
    assert exact_load(value.json) == exact_load(to_text(tree))


def test_negative_zero_keeps_its_sign() -> None:
    for text in [b"-0", b'[-0,"-0",0e-0,1E-0,-0.0,{"a":-0}]']:
        assert codec.value_from_json(text, "v", 100).json == text
    assert codec.canonical(codec.decode_exact(b"-0")) == b"-0"


def test_duplicate_keys_keep_the_last() -> None:
    assert codec.value_from_json(b'{"a":1,"b":2,"a":3}', "v", 100).json == b'{"a":3,"b":2}'
    assert exact_load(b'{"a":{}}') == Obj([("a", Obj())])


def test_invalid_json_and_size_limit() -> None:
    with pytest.raises(InvalidRequest, match=r"\$\.value: not valid JSON"):
        codec.value_from_json(b"{", "value", 100)
    with pytest.raises(ValueTooLarge) as caught:
        codec.value_from_json(b'"' + b"x" * 20 + b'"', "value", 10)
    assert caught.value.details == {"path": "$.value", "size": 22, "limit": 10}


typed_values = st.one_of(
    st.datetimes(timezones=st.none() | st.timezones()),
    st.dates(),
    st.times(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.uuids(),
    st.binary(max_size=20),
)


@settings(max_examples=200)
@given(typed_values)
def test_extended_types_round_trip(value: Any) -> None:
    stored = pyvalues.encode_value({"v": [value]}, "value", 10**6)
    back = pyvalues.decode_value(stored.json)["v"][0]
    assert type(back) is type(value)
    if isinstance(value, dt.datetime | dt.time) and value.tzinfo is not None:
        # The tag keeps the UTC offset, not a named zone: wall time and offset come back
        # (instants in a zone's DST gap do not compare equal across zones in Python).
        assert back.replace(tzinfo=None) == value.replace(tzinfo=None)
        assert back.utcoffset() == value.utcoffset()
    else:
        assert back == value
    if isinstance(value, decimal.Decimal):
        assert str(back) == str(value)  # digits and exponent kept
    if isinstance(value, dt.datetime | dt.time):
        assert back.tzinfo == value.tzinfo or back.utcoffset() == value.utcoffset()


def test_tag_format_is_documented_shape() -> None:
    stored = pyvalues.encode_value(
        [dt.datetime(2026, 11, 29, 15, 4, 5, 123000, tzinfo=dt.UTC), decimal.Decimal("1.2300"),
         uuid.UUID(int=1), b"\x00\xff"], "value", 10**6)
    assert stored.json == (
        b'[{"$type":"datetime","$value":"2026-11-29T15:04:05.123000+00:00"},'
        b'{"$type":"decimal","$value":"1.2300"},'
        b'{"$type":"uuid","$value":"00000000-0000-0000-0000-000000000001"},'
        b'{"$type":"bytes","$value":"AP8="}]')


def test_rfc3339_ms() -> None:
    assert clock.rfc3339_ms(1796042645123) == "2026-11-30T12:44:05.123Z"
    assert clock.rfc3339_ms(None) is None


@given(st.integers(0, 2**42), st.integers(0, 2**42))
def test_rfc3339_ms_is_the_utc_time_to_the_millisecond(epoch_ms: int, other_ms: int) -> None:
    clock.rfc3339_ms(other_ms)  # (a second formatted before is looked up, not formatted)
    moment = dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.UTC)
    expected = moment.replace(microsecond=epoch_ms % 1000 * 1000)
    assert dt.datetime.fromisoformat(clock.rfc3339_ms(epoch_ms) or "") == expected
    assert (clock.rfc3339_ms(epoch_ms) or "").endswith(f".{epoch_ms % 1000:03d}Z")
