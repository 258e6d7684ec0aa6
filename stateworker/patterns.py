"""The `*` pattern rule, for text already in Python: the same as scripts/lua/includes/glob.lua
(list-entries' key and topic patterns, delete-by-topic), so a pattern means one thing in a
script, in a moco listing and in a role's grants.

A `*` stands for any run of characters (none included); a run of stars is one star; every
other character stands for itself; the pattern matches the whole text.
"""

from __future__ import annotations


def glob_parts(pattern: str) -> list[str]:
    """The literal chunks of a `*` pattern; a run of stars is one star (as in glob.lua)."""
    parts = pattern.split("*")
    return [parts[0], *[p for p in parts[1:-1] if p], parts[-1]] if len(parts) > 1 else parts


def glob_match(subject: str, parts: list[str] | tuple[str, ...]) -> bool:
    """Whether `subject` matches the pattern of `parts` (`glob_parts`), the whole text."""
    if len(parts) == 1:
        return subject == parts[0]
    first, last = parts[0], parts[-1]
    if len(subject) < len(first) + len(last) or not subject.startswith(first) \
            or not subject.endswith(last):
        return False
    pos, end = len(first), len(subject) - len(last)
    for part in parts[1:-1]:
        at = subject.find(part, pos, end)
        if at < 0:
            return False
        pos = at + len(part)
    return True
