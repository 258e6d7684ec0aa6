"""The arguments of `stateworker principal ...` and `stateworker role ...` (app/admin.py runs
them): apart from it, as the tree is built for every command and admin.py imports the
service's state and the engines."""

from __future__ import annotations

import argparse
from typing import Any

from stateworker.app.output import add_output
from stateworker.state.core.grants import BUILTIN, FAMILIES

DRAIN_TIMEOUT_S = 60.0

ADMIN_EPILOG = f"""\
A role is one permission: --allow (function families: {', '.join(FAMILIES)}; or function-id
patterns: state::get, state::*, builtin.state.*) on --scopes (patterns, `*` any run of
characters), optionally only the read-only functions (--read-only), plus --services, the
services a trigger it registers may target. Built-in roles: {', '.join(BUILTIN)}.

exit status:
  0  done: one JSON document on stdout (`principal list`: a table on a terminal)
  1  refused ({{code, message, details}} on stderr), or `principal remove` timed out
     waiting for the service
  2  bad usage or configuration (arguments, --redis-url, STATEWORKER_* variables)
"""


def add_parsers(sub: Any) -> None:
    """The `principal` and `role` commands, on `main`'s subparsers; each verb with the
    exit statuses (ADMIN_EPILOG) in its --help."""
    principal = _verbs(sub, "principal", "acl mode: callers and their Redis users")
    add = _verb(principal, "add", "a principal, its ACL user and its stream; prints its "
                "password once")
    add.add_argument("name", help="the principal's name (also its Redis ACL user)")
    add.add_argument("--role", dest="roles", action="extend", nargs="+", required=True,
                     metavar="ROLE", help="the roles it holds (repeat, or several at once)")
    add.add_argument("--act-as", dest="act_as", action="extend", nargs="+", default=[],
                     metavar="PATTERN",
                     help="who its calls' context may name (user_id, dag_name, org_id ...)")
    add.add_argument("--password-stdin", action="store_true",
                     help="read the password from stdin instead of generating one")
    add.add_argument("--replace", action="store_true",
                     help="take over a Redis ACL user of that name that exists already (its "
                     "rules and passwords are replaced); never `default` nor the user this "
                     "command connects as")
    listed = _verb(principal, "list", "every principal: roles, act_as, whether its ACL user "
                   "exists")
    add_output(listed)
    remove = _verb(principal, "remove", "delete its ACL user, wait until the service has "
                   "served its calls, then delete its streams and record")
    remove.add_argument("name", help="the principal to remove")
    remove.add_argument("--timeout", type=float, default=DRAIN_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long to wait for the service (default {DRAIN_TIMEOUT_S:g})")
    passwd = _verb(principal, "passwd", "a new password (the old one stops working)")
    passwd.add_argument("name", help="the principal whose password changes")
    passwd.add_argument("--password-stdin", action="store_true",
                        help="read the password from stdin instead of generating one")
    role = _verbs(sub, "role", "acl mode: what principals may call, on which scopes")
    radd = _verb(role, "add", "a role (replacing one of the same name)")
    radd.add_argument("name", help="the role's name")
    radd.add_argument("--allow", nargs="+", required=True, metavar="FUNCTIONS",
                      help="families or function-id patterns (also comma-separated)")
    radd.add_argument("--scopes", nargs="+", required=True, metavar="PATTERN",
                      help="the scopes it applies to (patterns, `*` any run of characters)")
    radd.add_argument("--read-only", action="store_true",
                      help="only the read-only functions of --allow")
    radd.add_argument("--services", nargs="+", default=[], metavar="PATTERN",
                      help="the services a trigger it registers may target")
    _verb(role, "list", "every role, built-in ones included")
    rremove = _verb(role, "remove", "a role no principal holds")
    rremove.add_argument("name", help="the role to remove")


def _verbs(sub: Any, name: str, summary: str) -> Any:
    parser = sub.add_parser(name, help=summary, description=summary, epilog=ADMIN_EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser.add_subparsers(dest="verb", required=True, metavar="VERB",
                                 help=f"what to do (`stateworker {name} VERB --help`)")


def _verb(verbs: Any, name: str, summary: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = verbs.add_parser(
        name, help=summary, description=summary[0].upper() + summary[1:] + ".",
        epilog=ADMIN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser


