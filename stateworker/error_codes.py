"""What an error code is outside Python: the HTTP status of its error reply (`HTTP_STATUS`,
`http_status`: the HTTP face, app/http.py) and its section of docs/errors.md (`doc_url`; an
update op's code too). The classes, and the code -> class table, are errors.py's; its
`register` gives an engine's code its status here.

A leaf of leaves: it imports nothing of the package, so settings.py and errors.py can both
use it.
"""

from __future__ import annotations

import re

# Where docs/errors.md is published: every error code (and every `state::update` op error
# code) has a section of its own there, which `doc_url` links to (an op error's `doc_url`).
# The default is the project's repository; STATEWORKER_DOCS_URL points elsewhere.
ERRORS_DOC_URL = "https://github.com/stateworker/stateworker/blob/main/docs/errors.md"


def anchor(code: str) -> str:
    """The anchor of `code`'s heading in docs/errors.md, as GitHub (and Python-Markdown) make
    it from the heading's text: lower case, only letters, digits, `_` and `-` kept."""
    return re.sub(r"[^a-z0-9_-]", "", code.lower())


def doc_url(code: str, base: str = ERRORS_DOC_URL) -> str:
    """The link to `code`'s section of docs/errors.md under `base`."""
    return f"{base}#{anchor(code)}"


# The HTTP status of each code's error reply (the HTTP face, app/http.py); an update op's
# code (`increment.not_number`) is 409 there, any other code 500.
HTTP_STATUS: dict[str, int] = {
    "INVALID_REQUEST": 400, "UNKNOWN_FIELD": 400, "KEY_TOO_LONG": 400, "INVALID_PREFIX": 400,
    "INVALID_CONTEXT": 400, "DUPLICATE_KEY": 400, "INVALID_SCOPE": 400, "INVALID_CURSOR": 400,
    "UNKNOWN_CALLER": 401,
    "PERMISSION_DENIED": 403, "FORBIDDEN": 403, "RESERVED_SCOPE": 403,
    "NOT_FOUND": 404, "UNKNOWN_FUNCTION": 404,
    "CONFLICT": 409, "CALL_ID_REUSED": 409, "BARRIER_CONFIG": 409, "SCOPE_CONFLICT": 409,
    "SCOPE_IN_USE": 409, "KEY_LIMIT": 409,
    "COMPACTED": 410,
    "VALUE_TOO_LARGE": 413, "CALL_TOO_LARGE": 413, "ROW_TOO_LARGE": 413,
    "RESOURCE_EXHAUSTED": 507, "SNAPSHOT_CAPACITY": 507,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "STORE_LOST": 503,
    "RESTORE_REFUSED": 409, "LAYOUT_MISMATCH": 409,
    "DEADLINE_EXCEEDED": 504, "TIMEOUT": 504,
}


def http_status(code: str) -> int:
    """The HTTP status of an error reply with `code` (HTTP_STATUS; an update op's code, such
    as `increment.not_number` inside a transaction, is 409: a failed precondition)."""
    return HTTP_STATUS.get(code, 409 if "." in code else 500)
