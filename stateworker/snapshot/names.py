"""Names (scopes, keys, writers, trigger and barrier ids) in PostgreSQL text columns.

PostgreSQL text cannot hold the NUL character, which a scope, a key or a writer may contain
(they are any strings). A name without NUL and without U+FFFF is stored as it is, which is
every name in practice, so the tables stay plain to query; in the others NUL is written as
U+FFFF "0" and U+FFFF as U+FFFF U+FFFF (U+FFFF is a Unicode noncharacter: no text in use holds
it). `from_pg(to_pg(name)) == name` for every string.
"""

from __future__ import annotations

from typing import overload

ESCAPE = "\uffff"
_NUL_CODE = "0"


@overload
def to_pg(name: str) -> str: ...
@overload
def to_pg(name: None) -> None: ...
def to_pg(name: str | None) -> str | None:
    if name is None or ("\0" not in name and ESCAPE not in name):
        return name
    return name.replace(ESCAPE, ESCAPE + ESCAPE).replace("\0", ESCAPE + _NUL_CODE)


@overload
def from_pg(stored: str) -> str: ...
@overload
def from_pg(stored: None) -> None: ...
def from_pg(stored: str | None) -> str | None:
    if stored is None or ESCAPE not in stored:
        return stored
    out, i = [], 0
    while i < len(stored):
        char = stored[i]
        if char == ESCAPE and i + 1 < len(stored):
            out.append("\0" if stored[i + 1] == _NUL_CODE else stored[i + 1])
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)
