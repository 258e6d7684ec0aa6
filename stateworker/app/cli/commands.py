"""`stateworker` COMMAND: which function runs each subcommand, and the errors every command
turns into one line and an exit status (bad settings: 2; the service's Redis user lacking a
permission: 1). Each command's module is imported when it runs: `stateworker get` never
imports the service, the engines or psycopg (`serve` does)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Awaitable, Callable

from stateworker.app import service_user
from stateworker.app.cli import parser
from stateworker.app.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, settings_of
from stateworker.app.cli.completion import script
from stateworker.app.cli.suggest import refuse_extras
from stateworker.errors import ConfigError, MissingPermission, StateError
from stateworker.loop import run
from stateworker.transport.connection import check_url
from stateworker.transport.embedded import client_url

Command = Callable[[argparse.Namespace], Awaitable[int]]
# Each async command: its module (of app/cli) and function.
ASYNC: dict[str, tuple[str, str]] = {
    "call": ("calls", "run_call"), "get": ("calls", "run_get"), "put": ("calls", "run_put"),
    "del": ("calls", "run_del"), "ls": ("calls", "run_ls"),
    "delete-barrier": ("calls", "run_delete_barrier"), "scopes": ("verbs", "run_scopes"),
    "history": ("verbs", "run_history"), "triggers": ("verbs", "run_triggers"),
    "list-triggers": ("verbs", "run_list_triggers"), "watch": ("watching", "run_watch"),
    "status": ("status", "run_status"), "txn": ("multi", "run_txn"),
    "query": ("multi", "run_query"),
}


def main(argv: list[str] | None = None) -> int:
    tree = parser.build()
    given = sys.argv[1:] if argv is None else argv
    for at, arg in enumerate(given, 1):
        if not _utf8(arg):  # (bytes that are no UTF-8 come as lone surrogates: argv's decoding)
            tree.error(f"argument {at} is not valid UTF-8 text: "
                       f"{arg.encode('utf-8', 'surrogateescape')[:60]!r}")
    args, extras = tree.parse_known_args(given)
    refuse_extras(tree, args, extras)  # (the subcommand's usage, not the top level's)
    if args.command == "completion":
        print(script(tree, args.shell), end="")
        return EXIT_OK
    try:
        check_url(client_url(settings_of(args)))  # an unsupported scheme: one line, status 2
        return dispatch(args)
    except MissingPermission as exc:  # the service's Redis user: exit 1 (docs/security.md)
        print(f"stateworker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ConfigError as exc:  # (one with a code, LAYOUT_MISMATCH: the code first)
        coded = f"{exc.code}: " if isinstance(exc, StateError) else ""
        print(f"stateworker: {coded}{exc}", file=sys.stderr)
        return EXIT_USAGE


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def dispatch(args: argparse.Namespace) -> int:
    if args.command in ASYNC:
        module, name = ASYNC[args.command]
        command: Command = getattr(importlib.import_module(f"stateworker.app.cli.{module}"), name)
        return int(run(command, args))
    if args.command in ("serve", "restore"):
        from stateworker.app.cli import serving

        return serving.serve(args) if args.command == "serve" else serving.run_restore(args)
    if args.command == "acl-rule":
        return service_user.print_rule(args, settings_of(args))
    if args.command in ("principal", "role"):
        from stateworker.app import admin

        return int(run(admin.run_admin, settings_of(args), args))
    raise AssertionError(f"unhandled command {args.command}")  # argparse allows no other
