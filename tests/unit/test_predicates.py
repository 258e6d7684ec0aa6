"""state/query/predicates.py, pure: Number's order and equality against Fractions, the index
encoding's byte order against the values' order (what lets a range of the index answer a
range query), pointers per RFC 6901."""

from __future__ import annotations

from fractions import Fraction

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateworker.schemas import WhereItem
from stateworker.state.query import numbers
from stateworker.state.query import predicates as p

number_texts = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.tuples(st.integers(-(10**6), 10**6), st.text("0123456789", min_size=1, max_size=8)).map(
        lambda t: f"{t[0]}.{t[1]}"),
    st.tuples(st.integers(-999, 999), st.sampled_from(["e", "E"]),
              st.sampled_from(["", "+", "-"]), st.integers(0, 40)).map(
        lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}"),
    st.sampled_from(["0", "-0", "0.0", "-0.000", "0e5", "1", "1.0", "10", "0.1", "1e1", "100e-2"]),
)
strings = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
    ["\0", "\x01", "a", "\xff"]), max_size=6)


@given(a=number_texts, b=number_texts)
def test_numbers_compare_as_fractions(a: str, b: str) -> None:
    x, y = p.Number(a), p.Number(b)
    fa, fb = Fraction(a), Fraction(b)
    assert (x == y) is (fa == fb) and (x < y) is (fa < fb) and (x > y) is (fa > fb)
    assert (hash(x) == hash(y)) or fa != fb
    ea, eb = p.encode(x), p.encode(y)
    assert ea is not None and eb is not None
    assert (ea < eb) is (fa < fb) and (ea == eb) is (fa == fb)
    assert p.key_of_member(ea + b"key") == b"key"


@given(a=st.integers(-(10**40), 10**40), b=number_texts)
def test_an_int_orders_against_a_number_as_fractions(a: int, b: str) -> None:
    """A stored int is compared with a condition's number without being written in decimal."""
    difference = Fraction(a) - Fraction(b)
    assert numbers.order(a, p.Number(b)) == (difference > 0) - (difference < 0)
    assert numbers.order(p.Number(b), a) == (difference < 0) - (difference > 0)


@pytest.mark.parametrize(("found", "text", "sign"), [
    (10**4299, "1e4299", 0), (10**4299, "1e4300", -1), (10**4299 + 1, "1e4299", 1),
    (10**4299, "1" + "0" * 4299 + ".5", -1), (-(10**4299), "-1" + "0" * 4299 + ".5", 1),
    (10**4299, "1e5000", -1), (-(10**4299), "-1e5000", 1), (0, "1e-5000", -1),
    (-1, "-1e-5000", -1), (0, "-0.0", 0), (-1, "-0.5", -1), (0, "-0.5", 1),
])
def test_a_large_int_orders_by_its_magnitude_and_its_floor(found: int, text: str,
                                                           sign: int) -> None:
    assert numbers.order(found, p.Number(text)) == sign


def test_a_stored_number_is_read_once_however_many_conditions_compare_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fifteen conditions on one stored number of a million digits, and an `in` of a hundred
    numbers: it is made exact once for the entry (it was made again at each of the 115
    comparisons, each about a tenth of a second)."""
    made: list[int] = []
    original = numbers.Number.__init__

    def counted(self: numbers.Number, text: str) -> None:
        made.append(len(text))
        original(self, text)

    def where(op: str, value: str) -> WhereItem:
        return WhereItem(pointer="/n", op=op, value=msgspec.Raw(value.encode()))

    wheres = p.parse_where([where("gt", "0")] * 8 + [where("ne", "5")] * 7 + [where(
        "in", "[" + ",".join(f"{i}.5" for i in range(100)) + "]")])
    big = "0." + "1" * 1_000_000
    doc = p.decode_doc(f'{{"n":{big}}}'.encode())
    monkeypatch.setattr(numbers.Number, "__init__", counted)
    assert not p.matches(wheres, doc)
    assert made == [len(big)]


@given(a=strings, b=strings)
def test_strings_encode_in_byte_order(a: str, b: str) -> None:
    ea, eb = p.encode(a), p.encode(b)
    assert ea is not None and eb is not None
    assert (ea < eb) is (a.encode() < b.encode())
    assert p.encode(a + "x") is not None and p.string_prefix(a) <= ea < p.string_prefix(a) + b"\xff"
    assert p.key_of_member(ea + b"k\0ey") == b"k\0ey"


def test_types_sort_apart() -> None:
    order = [p.encode(v) for v in (None, False, True, p.Number("-1e9"), p.Number("0"),
                                   p.Number("1e-9"), "", "a")]
    assert order == sorted(order)  # type: ignore[type-var]
    assert p.encode([]) is None and p.encode({}) is None
    assert p.encode(p.Number("1e1000000000000000000")) is None
    assert p.Number("1e1000000000000000000") > p.Number("9e999999999999999999")
    assert p.Number("-1e-1000000000000000000") > p.Number("-1")


@pytest.mark.parametrize(("doc", "pointer", "found"), [
    ({"a": {"b": [1, 2]}}, "/a/b/1", 2), ({"a": 1}, "", {"a": 1}), ({"a/b": 1}, "/a~1b", 1),
    ({"~": 1}, "/~0", 1), ({"": 1}, "/", 1), ([1, 2], "/01", p.MISSING), ([1], "/-", p.MISSING),
    ([1], "/1", p.MISSING), ("abc", "/0", p.MISSING), ({"a": None}, "/a", None),
    ({"a": None}, "/a/b", p.MISSING),
])
def test_resolve(doc: object, pointer: str, found: object) -> None:
    assert p.resolve(doc, p.pointer_parts(pointer, "$.pointer")) == found


@given(doc=st.recursive(
    st.one_of(number_texts, st.sampled_from(["null", "true", "false", '"1"', '"a"', '"1.5"'])),
    lambda inner: st.one_of(st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
                            st.lists(inner, max_size=3).map(lambda xs: "{" + ",".join(
                                f'"k{i}":{x}' for i, x in enumerate(xs)) + "}")),
    max_leaves=6))
def test_a_stored_value_decoded_in_c_compares_as_the_exact_decoding(doc: str) -> None:
    """decode_doc (msgspec: ints, other numbers as text) holds every condition as decode
    (a Number per number) does, and a number's index bytes are the same."""
    fast, slow = p.decode_doc(doc.encode()), p.decode(doc)
    assert p.same(fast, slow) and p.encode(fast) == p.encode(slow)
    for value in (slow, *(slow if isinstance(slow, list) else [])):
        for op in ("eq", "ne", "lt", "gte", "prefix"):
            if op in p.RANGE_OPS and p._kind(value) not in ("num", "str"):
                continue
            if op == "prefix" and not isinstance(value, str):
                continue
            where = p.Where("", (), op, value)
            assert p.holds(where, fast) == p.holds(where, slow), (doc, op, value)


def test_an_integer_past_msgspec_is_still_exact() -> None:
    big = "1" + "0" * 5000
    assert p.same(p.decode_doc(f"[{big}, 1.5]".encode()), p.decode(f"[{big}.0, 15e-1]"))
    assert not p.same(p.decode_doc(f"[{big}]".encode()), p.decode(f"[{big}1]"))
