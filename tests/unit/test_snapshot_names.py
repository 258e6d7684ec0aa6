"""Names in PostgreSQL text: NUL never reaches it, every string comes back as it was, and a
name without NUL or U+FFFF is stored as it is (the tables stay plain to query)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stateworker.snapshot.names import ESCAPE, from_pg, to_pg

NAMES = st.text(st.one_of(st.sampled_from(["\0", ESCAPE, "0", "a"]), st.characters()))


@given(NAMES)
def test_every_name_round_trips_without_nul(name: str) -> None:
    stored = to_pg(name)
    assert "\0" not in stored
    assert from_pg(stored) == name


@given(st.text(st.characters(blacklist_characters=["\0", ESCAPE])))
def test_a_name_without_nul_or_the_escape_is_stored_as_it_is(name: str) -> None:
    assert to_pg(name) == name == from_pg(name)


def test_none_stays_none() -> None:
    assert to_pg(None) is None and from_pg(None) is None
