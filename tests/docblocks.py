"""The fenced code blocks of a Markdown document, so docs' examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def fenced_blocks(document: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced block of `document` (a path under the project's
    root, e.g. "docs/moco.md"), in order; the language is "" for a plain fence."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((ROOT / document).read_text())]


def blocks_of(document: str, language: str) -> list[str]:
    return [text for lang, text in fenced_blocks(document) if lang == language]


def session(text: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, expected output lines)."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip():
            steps[-1][1].append(line)
    return steps


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual) is not None
