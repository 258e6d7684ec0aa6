"""The CLI's tables (app/output.py): one row a line whatever a key holds, columns aligned as a
terminal shows them."""

from __future__ import annotations

from stateworker.app.output import table


def test_control_characters_are_escaped_and_wide_characters_take_two_columns() -> None:
    lines = table(["KEY", "V"], [["a\nb", 1], ["日本", 2], ["x\ty\x1b", None], ["e\u0301", 4]]
                  ).split("\n")
    assert lines == ["KEY       V", "a\\nb      1", "日本      2", "x\\ty\\x1b  -",
                     "e\u0301         4"]
