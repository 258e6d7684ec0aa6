"""`errors.shown`: a value in a message as the caller wrote it, JSON text, never a repr."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from stateworker.errors import shown


@pytest.mark.parametrize(("value", "text"), [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    ("orders", '"orders"'),
    ("it's", '"it\'s"'),
    ("", '""'),
    (12, "12"),
    ([1, None, "a"], '[1,null,"a"]'),
    ({"a": None, "b": [True]}, '{"a":null,"b":[true]}'),
    ("tab\there", '"tab\\there"'),
])
def test_json_values_show_as_json(value: Any, text: str) -> None:
    assert shown(value) == text
    assert json.loads(shown(value)) == value


def test_what_json_cannot_hold_shows_as_a_json_string() -> None:
    lone = shown("a\ud800b")  # a lone surrogate: no UTF-8 for it
    assert json.loads(lone) == "a\ud800b" and "'" not in lone
    assert shown(Decimal("1.5")) == '"1.5"'
    assert shown(object) == json.dumps(str(object))
