"""`--output json|table` for the commands that list things (status, ls, query, scopes,
history, triggers ls, principal list): the default (a table on a terminal, JSON when piped),
the table layout and its cells (JSON values with their stored digits: never through a
float)."""

from __future__ import annotations

import argparse
import sys
import unicodedata
from collections.abc import Sequence
from typing import Any

import msgspec

from stateworker.errors import shown


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", choices=("json", "table"), default=None,
                        help="json (one document) or table (for people); default: table when "
                        "stdout is a terminal, json when it is piped or redirected")


def wants_table(args: argparse.Namespace) -> bool:
    if args.output is not None:
        return bool(args.output == "table")
    return sys.stdout.isatty()


# Control characters in a cell, escaped: a key holding a newline or a tab stays on its row.
_CONTROL = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F)} | {
    0x0A: "\\n", 0x09: "\\t", 0x0D: "\\r"}


def _width(text: str) -> int:
    """Columns `text` takes on a terminal: wide (CJK, most emoji) 2, combining marks 0."""
    return sum(0 if unicodedata.combining(char) else
               2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns aligned to their widest cell (as a terminal shows it), headers first; a cell
    None shows as `-`, control characters escaped (`\\n`)."""
    cells = [list(headers)] + [["-" if c is None else str(c).translate(_CONTROL) for c in row]
                               for row in rows]
    widths = [max(_width(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c + " " * (w - _width(c)) for c, w in zip(row, widths, strict=True)
                               ).rstrip() for row in cells)


def listing(headers: Sequence[str], rows: Sequence[Sequence[object]], empty: str) -> str:
    """`table`, or `empty` when there are no rows: a line that says there is nothing, where a
    header alone would leave a person wondering."""
    return table(headers, rows) if rows else empty


def cell(value: Any) -> str:
    """A JSON value in a table cell: as JSON text (JSON bytes, or msgspec.Raw, as they are:
    numbers with their stored digits), cut to 60 characters."""
    text = bytes(value).decode() if isinstance(value, bytes | msgspec.Raw) else shown(value)
    return text if len(text) <= 60 else text[:59] + "…"
