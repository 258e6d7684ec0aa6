"""`codec.whole_number`: a caller's number text, checked so that it cannot crash `int`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stateworker.codec import whole_number


@given(st.text(max_size=30))
def test_a_whole_number_is_ascii_digits_within_the_limit_else_none(text: str) -> None:
    got = whole_number(text, 18)
    if text and len(text) <= 18 and all("0" <= c <= "9" for c in text):
        assert got == int(text)
    else:
        assert got is None


def test_other_digits_and_long_runs_are_none() -> None:
    assert whole_number("²") is None and whole_number("٣") is None
    assert whole_number("9" * 5000, 18) is None and whole_number("9" * 18, 18) == 10**18 - 1
    assert whole_number("") is None and whole_number(" 1") is None and whole_number("+1") is None
