"""`stateworker` COMMAND: which function runs each subcommand, and the errors every command
turns into one line and an exit status (bad settings: 2; the service's Redis user lacking a
permission: 1)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable

import msgspec
import psycopg

from stateworker import logs, tracing
from stateworker.app import admin, service, service_user
from stateworker.app.cli import calls, multi, parser, status, watching
from stateworker.app.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, settings_of
from stateworker.app.cli.completion import script
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, MissingPermission, StateError, Unavailable
from stateworker.loop import run, tune_gc_for_serving
from stateworker.settings import Settings
from stateworker.snapshot import restore
from stateworker.state import lifecycle
from stateworker.transport.connection import check_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost

Command = Callable[[argparse.Namespace], Awaitable[int]]
ASYNC: dict[str, Command] = {
    "call": calls.run_call, "get": calls.run_get, "put": calls.run_put, "del": calls.run_del,
    "ls": calls.run_ls, "list-triggers": calls.run_list_triggers,
    "delete-barrier": calls.run_delete_barrier, "watch": watching.run_watch,
    "status": status.run_status, "txn": multi.run_txn, "query": multi.run_query,
}


def _http_urls(address: str) -> dict[str, str]:
    """Where the HTTP face serves (app/http.py): the console, the call API, Dapr's paths."""
    base = f"http://{address}"
    return {"http": address, "console": f"{base}/console/", "calls": f"{base}/v1/call/<function>",
            "dapr": f"{base}/v1.0/state/<store>"}


def serve(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    if args.http is not None:
        settings = msgspec.structs.replace(settings, http=args.http)
    options = BusOptions(
        consumer=args.consumer or "", visibility_timeout_ms=args.visibility_timeout_ms,
        grace_s=args.grace_s, concurrency=args.concurrency)
    logs.configure(args.log_level)

    def ready(svc: service.StateService) -> None:
        url = svc.state.conn.shown
        print(msgspec.json.encode({"serving": "state", "redis": url,
                                   "stream": svc.bus.stream,
                                   **({"shards": len(svc.bus.streams)}
                                      if len(svc.bus.streams) > 1 else {}),
                                   "consumer": svc.runtime.consumer,
                                   **(_http_urls(svc.http_address) if svc.http_address
                                      else {}),
                                   **svc.runtime.describe}).decode(), flush=True)

    # OTEL_EXPORTER_OTLP_ENDPOINT set: the SDK exports the spans of traced calls; what is
    # left is exported at the stop.
    export = tracing.setup_export()
    tune_gc_for_serving()
    try:
        run(service.serve, settings, options, ready)
    finally:
        if export is not None:
            export.shutdown()
    return EXIT_OK


async def restore_all(settings: Settings) -> int:
    """Rebuild Redis from PostgreSQL: a progress line on stderr, the summary (JSON) on stdout."""
    if not settings.postgres_url:
        raise ConfigError("restore reads the snapshot in PostgreSQL: set "
                          "STATEWORKER_POSTGRES_URL")
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        line = f"restored {done}/{total} entries"
        print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            summary = await restore.restore(state, settings.postgres_url, progress)
    except (psycopg.Error, OSError) as exc:
        return _refused(Unavailable(f"restore: PostgreSQL failed: {exc}; nothing more was "
                                    "written (run it again: it goes on over what it wrote)"))
    except ConnectionLost as exc:
        return _refused(Unavailable(f"restore: Redis went away: {exc}; run it again: it goes "
                                    "on over what it wrote"))
    except StateError as exc:
        return _refused(exc)
    if tty:
        print(file=sys.stderr)
    print(msgspec.json.encode(summary).decode(), flush=True)
    return EXIT_OK


def _refused(exc: StateError) -> int:
    """A refused or failed restore: {code, message, details} on stderr, status 1."""
    if sys.stderr.isatty():
        print(file=sys.stderr)  # (after the progress line)
    print(msgspec.json.encode(exc.to_dict()).decode(), file=sys.stderr, flush=True)
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    tree = parser.build()
    given = sys.argv[1:] if argv is None else argv
    for at, arg in enumerate(given, 1):
        if not _utf8(arg):  # (bytes that are no UTF-8 come as lone surrogates: argv's decoding)
            tree.error(f"argument {at} is not valid UTF-8 text: "
                       f"{arg.encode('utf-8', 'surrogateescape')[:60]!r}")
    args = tree.parse_args(argv)
    if args.command == "completion":
        print(script(tree, args.shell), end="")
        return EXIT_OK
    try:
        check_url(client_url(settings_of(args)))  # an unsupported scheme: one line, status 2
        return dispatch(args)
    except MissingPermission as exc:  # the service's Redis user: exit 1 (docs/security.md)
        print(f"stateworker: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def dispatch(args: argparse.Namespace) -> int:
    if args.command in ASYNC:
        return int(run(ASYNC[args.command], args))
    if args.command == "serve":
        return serve(args)
    if args.command == "acl-rule":
        return service_user.print_rule(args, settings_of(args))
    if args.command == "restore":
        return int(run(restore_all, settings_of(args)))
    if args.command in ("principal", "role"):
        return int(run(admin.run_admin, settings_of(args), args))
    raise AssertionError(f"unhandled command {args.command}")  # argparse allows no other
