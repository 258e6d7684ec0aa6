"""The `stateworker` command: serve, call and the short verbs (get, put, del, ls,
list-triggers, delete-barrier), watch, status, restore, acl-rule, principal and role, completion.

`commands.main` runs one; `parser` builds the argument tree (texts: its epilogs); `calls`,
`watching` and `status` hold the commands that talk to the service or its Redis."""

from stateworker.app.cli.commands import main
from stateworker.app.cli.status import status_report

__all__ = ["main", "status_report"]
