"""The `stateworker` argument parser: every subcommand with a description, every option's
help and an epilog with its exit statuses (tests/integration/cli/test_terminal.py walks the
tree, so a new subcommand is held to it)."""

from __future__ import annotations

import argparse
from importlib import metadata
from typing import TypeAlias

from stateworker.app import service_user
from stateworker.app.cli import admin_parser, texts
from stateworker.app.cli.common import (
    RAW,
    duration_ms,
    json_object,
    positive,
    seconds,
    service_name,
    version_number,
)
from stateworker.app.cli.completion import SHELLS
from stateworker.app.cli.suggest import Parser
from stateworker.app.cli.watching import revision
from stateworker.app.output import add_output

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def version() -> str:
    try:
        return metadata.version("stateworker")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown (not installed)"


def build() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = Parser(
        prog="stateworker", description="Durable, reactive key/value state over Redis "
        "streams: serve it, call it, watch it, look at it.", epilog=texts.TOP,
        formatter_class=RAW)
    parser.add_argument("--version", action="version", version=f"stateworker {version()}",
                        help="print the installed version and exit")
    parser.add_argument("--redis-url", default=None,
                        help="Redis to use (default: STATEWORKER_REDIS_URL, else embedded)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do (`stateworker COMMAND --help`)")
    _serving(sub)
    _calls(sub)
    _verbs(sub)
    _watch(sub)
    status = _add(sub, "status", "Redis, services, pending calls, triggers, dispatch and "
                  "snapshot lag", texts.STATUS)
    add_output(status)
    _add(sub, "restore", "rebuild an empty Redis from the PostgreSQL snapshot "
         "(STATEWORKER_POSTGRES_URL): entries, triggers, claims", texts.RESTORE)
    service_user.add_command(sub)
    admin_parser.add_parsers(sub)
    completion = _add(sub, "completion", "print a bash or zsh completion script",
                      texts.COMPLETION)
    completion.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")
    return parser


def _add(sub: Sub, name: str, summary: str, epilog: str,
         description: str | None = None) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description or summary[0].upper() + summary[1:] + ".",
        epilog=epilog, formatter_class=RAW)
    return parser


def _serving(sub: Sub) -> None:
    serve = _add(sub, "serve", "run the state service until SIGINT/SIGTERM", texts.SERVE)
    serve.add_argument("--consumer", default=None, help="consumer name (default host-pid)")
    serve.add_argument("--visibility-timeout-ms", type=int, default=30_000,
                       help="take over calls a dead consumer left pending this long")
    serve.add_argument("--grace-s", type=float, default=10.0,
                       help="on stop, how long calls in flight may take")
    serve.add_argument("--concurrency", type=int, default=1024, help="calls in flight at most")
    serve.add_argument("--http", default=None, metavar="HOST:PORT",
                       help="serve the HTTP face there: the console at /console/, POST "
                            "/v1/call/<function>, Dapr's state API at /v1.0/state/<store>, "
                            "/metrics, /healthz, /readyz (docs/http.md; default off, "
                            "STATEWORKER_HTTP)")
    serve.add_argument("--log-level", default="INFO",
                       help="DEBUG, INFO (default), WARNING or ERROR")


def _timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                        help="the call's whole time, and its deadline (default 10)")


def _calls(sub: Sub) -> None:
    call = _add(sub, "call", "call one function; print its JSON result", texts.CALL,
                "Call one function over the bus (the state service's, or a Worker's) and "
                "print its JSON result.")
    call.add_argument("fn", help="the function id: state::get, state::set, state::update "
                      "... (README: Functions), or a Worker's, e.g. orders::create")
    call.add_argument("body", nargs="?", default="{}",
                      help="the request: one JSON object (default {}); numbers go as written")
    _timeout(call)
    call.add_argument("--service", type=service_name, default="state",
                      help="whose stream gets the call, <prefix>:bus:<service>: state "
                      "(default) or a Worker's service name")
    call.add_argument("--context", type=json_object, default=None, metavar="JSON",
                      help="the call's context, a JSON object: who calls, for the functions "
                      "that take isolation from it (user_id, dag_name, root_dag_name, "
                      "org_id, workflow_id, execution_id ...)")


def _address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scope", help="the scope (a group of keys, e.g. orders)")
    parser.add_argument("key", help="the key in the scope")


def _verbs(sub: Sub) -> None:
    get = _add(sub, "get", "print a key's value (JSON)", texts.GET)
    _address(get)
    _timeout(get)
    put = _add(sub, "put", "write a key's value (JSON, or - for stdin)", texts.PUT)
    _address(put)
    put.add_argument("value", help="one JSON value: 12.5, '\"text\"', '{\"a\":1}'; - reads it "
                     "from stdin")
    put.add_argument("--ttl", type=duration_ms, default=None, metavar="DURATION",
                     help="expire the key this long after the write: 30s, 5m, 2h, 1d, 250ms "
                     "(a bare number is seconds); default: never")
    put.add_argument("--topic", default=None, help="tag the entry with a topic (ls shows it; "
                     "state::delete-by-topic deletes by it)")
    put.add_argument("--if-version", type=version_number, default=None, metavar="N",
                     help="write only if the entry is at version N (0: only if the key is "
                     "absent); else CONFLICT, exit 1, nothing written")
    _timeout(put)
    delete = _add(sub, "del", "delete a key (print its old value), or every key with a prefix",
                  texts.DEL)
    delete.add_argument("scope", help="the scope (a group of keys, e.g. orders)")
    delete.add_argument("key", nargs="?", default=None, help="the key in the scope (or "
                        "--prefix)")
    delete.add_argument("--prefix", default=None, help="delete every key of the scope that "
                        "starts with this (state::delete-by-prefix, in batches); prints "
                        "{\"deleted\": N}")
    _timeout(delete)
    ls = _add(sub, "ls", "list a scope's keys with their version, time and topic", texts.LS)
    ls.add_argument("scope", help="the scope to list")
    ls.add_argument("--prefix", default=None, help="only keys that start with this")
    ls.add_argument("--limit", type=positive, default=100, help="entries per page "
                    "(default 100, at most 1000)")
    ls.add_argument("--after", default=None, metavar="CURSOR",
                    help="the next page: the cursor the page before ended with (its "
                    "next_after; a table prints the whole command)")
    ls.add_argument("--values", action="store_true", help="show each entry's value too")
    _timeout(ls)
    add_output(ls)
    _multi(sub)
    _listings(sub)
    gone = _add(sub, "delete-barrier", "delete a barrier (state::delete-barrier)",
                texts.DELETE_BARRIER)
    gone.add_argument("id", help="the barrier's id (its condition_config.id)")
    _timeout(gone)


def _listings(sub: Sub) -> None:
    scopes = _add(sub, "scopes", "list the scopes that hold keys", texts.SCOPES)
    scopes.add_argument("--pattern", default=None, metavar="GLOB",
                        help="only scopes matching this (`*` any run of characters, `?` one)")
    scopes.add_argument("--limit", type=positive, default=1000, help="scopes at most "
                        "(default and most 1000)")
    _timeout(scopes)
    add_output(scopes)
    history = _add(sub, "history", "a key's recent changes, newest first", texts.HISTORY)
    _address(history)
    add_output(history)
    triggers = _add(sub, "list-triggers", "list the registered triggers (as `triggers ls`)",
                    texts.LIST_TRIGGERS)
    _timeout(triggers)
    add_output(triggers)
    _triggers(sub)


def _triggers(sub: Sub) -> None:
    verbs = _add(sub, "triggers", "list, add and remove triggers: the functions called for "
                 "change events", texts.TRIGGERS).add_subparsers(
        dest="verb", required=True, metavar="VERB",
        help="what to do (`stateworker triggers VERB --help`)")
    ls = _add(verbs, "ls", "list the registered triggers", texts.LIST_TRIGGERS)
    _timeout(ls)
    add_output(ls)
    add = _add(verbs, "add", "register a trigger: call a service's function for every "
               "matching change event", texts.TRIGGERS_ADD)
    add.add_argument("function", help="the function to call, e.g. audit::seen")
    add.add_argument("--service", type=service_name, required=True,
                     help="the service whose stream gets the calls (a Worker's name)")
    add.add_argument("--id", default=None, help="the trigger's id (default: a new one); "
                     "registering an id again replaces that trigger")
    add.add_argument("--scope", default=None, help="only this scope's events")
    add.add_argument("--key", default=None, help="only this key's events")
    add.add_argument("--key-prefix", default=None, help="only keys that start with this")
    add.add_argument("--event-type", dest="event_types", action="append", default=None,
                     choices=("created", "updated", "deleted"),
                     help="only these kinds of change (repeat it; default: every kind)")
    add.add_argument("--ttl", type=duration_ms, default=None, metavar="DURATION",
                     help="a lease: the trigger is gone this long after registering unless "
                     "kept (state::keep-trigger): 30s, 5m, 1h; default: never")
    _timeout(add)
    remove = _add(verbs, "rm", "remove a trigger", texts.TRIGGERS_RM)
    remove.add_argument("id", help="the trigger's id (`triggers ls` lists them)")
    _timeout(remove)


def _multi(sub: Sub) -> None:
    txn = _add(sub, "txn", "write several keys of a scope all or nothing (a JSON file)",
               texts.TXN)
    txn.add_argument("scope", help="the scope every op writes")
    txn.add_argument("file", nargs="?", default="-", help="the transaction: a JSON list of "
                     "ops, or an object with ops (and compare, else_ops); - or none: stdin")
    _timeout(txn)
    add_output(txn)
    query = _add(sub, "query", "list a scope's entries whose values match", texts.QUERY)
    query.add_argument("scope", help="the scope to search")
    query.add_argument("--where", action="append", default=[], metavar="'POINTER OP [VALUE]'",
                       help="one condition on the values, e.g. '/status eq \"open\"' or "
                       "'/total gte 100' (OP: eq ne lt lte gt gte in exists prefix); "
                       "repeat it: every one must hold")
    query.add_argument("--limit", type=positive, default=100, help="entries per page "
                       "(default 100, at most 1000)")
    query.add_argument("--after", default=None, metavar="CURSOR",
                       help="the next page: the cursor the page before ended with")
    _timeout(query)
    add_output(query)


def _watch(sub: Sub) -> None:
    watch = _add(sub, "watch", "print change events as JSON lines, as they happen",
                 texts.WATCH, "Print the change events of a scope, a key or every scope as "
                 "JSON lines (new ones, or every one after --from).")
    watch.add_argument("scope", nargs="?", default=None,
                       help="only this scope's events (default: every scope)")
    watch.add_argument("key", nargs="?", default=None,
                       help="only this key's events (of the scope)")
    watch.add_argument("--scope", dest="scope_option", default=None, metavar="SCOPE",
                       help="the same as SCOPE")
    watch.add_argument("--key", dest="key_option", default=None, metavar="KEY",
                       help="only this key's events (of the scope, or of every scope)")
    watch.add_argument("--prefix", default=None, help="only keys that start with this")
    watch.add_argument("--from", dest="from_revision", type=revision, default=None,
                       metavar="REVISION", help="every event after this revision (an event's "
                       "or a bookmark's); default: only new events")
    watch.add_argument("--progress", action="store_true",
                       help="also print a bookmark after a quiet while (as etcdctl's "
                       "--progress-notify), to resume from")
