"""The `stateworker` command: serve, call and the short verbs (get, put, del, ls, scopes,
history, triggers, delete-barrier), watch, status, restore, acl-rule, principal and role,
completion.

`commands.main` runs one; `parser` builds the argument tree (texts: its epilogs); `calls`,
`verbs`, `watching`, `status` and `serving` hold the commands, each imported by the command
that runs it (`stateworker get` starts without the server side)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stateworker.app.cli.commands import main

if TYPE_CHECKING:
    from stateworker.app.cli.status import status_report


def __getattr__(name: str) -> Any:
    if name != "status_report":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from stateworker.app.cli.status import status_report

    return status_report


__all__ = ["main", "status_report"]
