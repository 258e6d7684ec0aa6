"""README's settings table names every setting, and no setting that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from stateworker.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_settings_table_names_each_setting_once() -> None:
    rows = re.findall(r"^\| `STATEWORKER_([A-Z_]+)`", README.read_text(), re.MULTILINE)
    fields = sorted(field.name.upper() for field in msgspec.structs.fields(Settings))
    assert sorted(rows) == fields
