"""The `stateworker` command: serve, call, watch, status, restore, acl-rule."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any, BinaryIO

import anyio
import msgspec

from stateworker import logs
from stateworker.app import admin, service, service_user
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.clock import rfc3339_ms
from stateworker.errors import ConfigError, InvalidRequest, MissingPermission, StateError, shown
from stateworker.events.model import Bookmark, bookmark_json, document_json, parse_revision
from stateworker.events.watch import Watch
from stateworker.keys import KeySpace, bus_streams_pattern, stats_key
from stateworker.loop import run, tune_gc_for_serving
from stateworker.reactive.status import dispatch_status
from stateworker.settings import Settings
from stateworker.snapshot import restore
from stateworker.snapshot.status import snapshot_status
from stateworker.state import lifecycle
from stateworker.transport.connection import RedisConnection, check_url, shown_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost, ReplyError


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(redis_url=args.redis_url)


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    options = BusOptions(
        consumer=args.consumer or "", visibility_timeout_ms=args.visibility_timeout_ms,
        grace_s=args.grace_s, concurrency=args.concurrency)
    logs.configure(args.log_level)

    def ready(svc: service.StateService) -> None:
        url = svc.state.conn.shown
        print(msgspec.json.encode({"serving": "state", "redis": url,
                                   "stream": svc.bus.stream,
                                   "consumer": svc.runtime.consumer,
                                   **svc.runtime.describe}).decode(), flush=True)

    tune_gc_for_serving()
    run(service.serve, settings, options, ready)
    return 0


CALL_EPILOG = """\
--timeout is the call's whole time: waiting for Redis (restarting, loading), sending,
re-sending and the reply. The call carries its deadline (now + timeout, as deadline_ms), so
after a TIMEOUT it is applied before that deadline or never; the message says so.

exit status:
  0  the call succeeded: its result (JSON) is on stdout
  1  the call failed: {code, message, details} on stderr (JSON): an error reply
     (INVALID_REQUEST, CONFLICT, UNKNOWN_FUNCTION ...), TIMEOUT (no reply in time; it may
     still be applied before its deadline) or UNAVAILABLE (no Redis, or it never took the
     call: it will not be applied)
  2  bad usage or configuration (arguments, --redis-url, STATEWORKER_* variables)

examples:
  stateworker call state::set '{"scope":"orders","key":"o-1","value":{"total":12.50}}'
  stateworker call --timeout 2 state::get '{"scope":"orders","key":"o-1"}'
  stateworker call --service orders orders::create '{"id":"o-7"}'   # a Worker("orders")
  stateworker call --context '{"dag_name":"etl"}' state.set '{"key":"cursor","value":7}'
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {shown(text)}")
    return value


def _context(text: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {shown(text)}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {shown(text)}")
    return value


def _service_name(text: str) -> str:
    if not text or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(f"must be a service name without spaces, got {shown(text)}")
    return text


async def _call(args: argparse.Namespace) -> int:
    """One call; the exit status of CALL_EPILOG. `--timeout` bounds it all: opening the
    client (which waits for a Redis that is restarting) and the call."""
    end = time.monotonic() + args.timeout
    try:
        async with StateClient(settings=_settings(args), service=args.service,
                               timeout=args.timeout) as client:
            left = max(end - time.monotonic(), 0.001)
            result = await client.call_json(args.fn, args.body.encode(), timeout=left,
                                            context=args.context)
    except StateError as exc:
        print(msgspec.json.encode(exc.to_dict()).decode(), file=sys.stderr)
        return 1
    print(result.decode())
    return 0


WATCH_EPILOG = """\
Prints one JSON line per event, as it happens: {"type":"state","event_type":"state:updated",
"scope","key","old_value","new_value","version","revision","ts","ts_ms","by"}; and, after
STATEWORKER_WATCH_PROGRESS_S (5) seconds without one, a bookmark {"type":"bookmark",
"revision":...}: every event up to it has been printed (or passed over by --scope/--key), so
--from <its revision> goes on from there without printing anything twice. One scope's events
come in their order; without --scope, every partition's, merged in revision order. A Redis
restart or a broken connection is waited out; the watch goes on where it was.

exit status:
  0  stopped by Ctrl-C or SIGTERM
  1  {code, message, details} on stderr (JSON): COMPACTED (events after the revision were
     trimmed; details.oldest_kept names the oldest kept: resync), or UNAVAILABLE (no Redis)
  2  bad usage or configuration (arguments, --from that is not <ms>-<seq>, --redis-url)

examples:
  stateworker watch --scope orders
  stateworker watch --scope orders --key o-1 --from 1700000000000-0
  stateworker watch | jq -c 'select(.type == "state")'
"""


def _revision(text: str) -> str:
    try:
        parse_revision(text, "--from")
    except InvalidRequest as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


async def _watch(args: argparse.Namespace) -> int:
    """Print the watch's items until SIGINT/SIGTERM (status 0) or an error (WATCH_EPILOG)."""
    status = 0
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()

            async def print_items() -> None:
                nonlocal status
                status = await _print_watch(args, sys.stdout.buffer)
                tg.cancel_scope.cancel()

            tg.start_soon(stop_on_signal)
            tg.start_soon(print_items)
    return status


async def _print_watch(args: argparse.Namespace, out: BinaryIO) -> int:
    settings = _settings(args)
    try:
        async with Watch(client_url(settings), settings, scope=args.scope, key=args.key,
                         from_revision=args.from_revision) as watch:
            async for item in watch:
                out.write(bookmark_json(item) if isinstance(item, Bookmark)
                          else document_json(item))
                out.write(b"\n")
                out.flush()  # a line as soon as it happens, also into a pipe
    except StateError as exc:
        print(msgspec.json.encode(exc.to_dict()).decode(), file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`| head`): done, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # nothing left to flush there
    return 0


async def status_report(settings: Settings) -> dict[str, Any]:
    """Redis, AOF, the bus streams with their pending calls and consumers, the counters, and
    the dispatch: triggers, replicas, per-partition holders, lag and cuts; the snapshot:
    per-partition lag (events, ms) and its last error (null: no snapshot ran)."""
    url = client_url(settings)
    conn = RedisConnection(url)
    report: dict[str, Any] = {"redis": shown_url(url), "state_dir": None if settings.redis_url
                              else settings.state_dir, "prefix": settings.prefix}
    try:
        info = (await conn.execute("INFO", "persistence")).decode()
    except ConnectionLost as exc:
        report.update(reachable=False, error=str(exc))
        return report
    try:
        report.update(reachable=True, aof="aof_enabled:1" in info, services={})
        cursor = b"0"
        streams: list[bytes] = []
        while True:
            cursor, found = await conn.execute("SCAN", cursor, "MATCH",
                                               bus_streams_pattern(settings.prefix),
                                               "TYPE", "stream", "COUNT", 1000)
            streams += found
            if cursor in (b"0", "0"):
                break
        for stream in sorted(streams):
            name = stream.decode().rsplit(":", 1)[-1]
            report["services"][name] = await _service_status(conn, stream, name, settings)
        keys = KeySpace(settings.prefix, settings.partitions)
        report["dispatch"] = await dispatch_status(conn, keys)
        report["snapshot"] = await snapshot_status(conn, keys)
    finally:
        await conn.close()
    return report


async def _service_status(conn: RedisConnection, stream: bytes, group: str,
                          settings: Settings) -> dict[str, Any]:
    length = await conn.execute("XLEN", stream)
    try:
        pending = await conn.execute("XPENDING", stream, group)
        consumers = await conn.execute("XINFO", "CONSUMERS", stream, group)
    except ReplyError:  # no group yet: nobody has served this stream
        pending, consumers = [0], []
    flat = await conn.execute("HGETALL", stats_key(settings.prefix, group))
    counters = {k.decode(): int(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    flushed = counters.pop("flushed_ms", None)
    return {
        "stream_length": length,
        "pending": pending[0],
        "consumers": [_pairs(c) for c in consumers],
        "counters": counters,
        # The service adds its counts every FLUSH_EVERY_S: they are this old at most.
        "counters_as_of": rfc3339_ms(flushed),
    }


async def _restore(settings: Settings) -> int:
    """Rebuild Redis from PostgreSQL: a progress line on stderr, the summary (JSON) on stdout."""
    if not settings.postgres_url:
        raise ConfigError("restore reads the snapshot in PostgreSQL: set "
                          "STATEWORKER_POSTGRES_URL")
    tty = sys.stderr.isatty()

    def progress(done: int, total: int) -> None:
        line = f"restored {done}/{total} entries"
        print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    async with lifecycle.open_state(settings=settings, reaper=False) as state:
        summary = await restore.restore(state, settings.postgres_url, progress)
    if tty:
        print(file=sys.stderr)
    print(msgspec.json.encode(summary).decode(), flush=True)
    return 0


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return {k.decode(): (v.decode() if isinstance(v, bytes) else v)
            for k, v in zip(flat[::2], flat[1::2], strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stateworker", description=__doc__)
    parser.add_argument("--redis-url", default=None,
                        help="Redis to use (default: STATEWORKER_REDIS_URL, else embedded)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the state service until SIGINT/SIGTERM")
    serve_p.add_argument("--consumer", default=None, help="consumer name (default host-pid)")
    serve_p.add_argument("--visibility-timeout-ms", type=int, default=30_000,
                         help="take over calls a dead consumer left pending this long")
    serve_p.add_argument("--grace-s", type=float, default=10.0,
                         help="on stop, how long calls in flight may take")
    serve_p.add_argument("--concurrency", type=int, default=1024, help="calls in flight at most")
    serve_p.add_argument("--log-level", default="INFO")
    call_p = sub.add_parser(
        "call", help="call one function; print its JSON result",
        description="Call one function over the bus (the state service's, or a Worker's) "
                    "and print its JSON result.",
        epilog=CALL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    call_p.add_argument("fn", help="the function id: state::get, state::set, state::update "
                        "... (README: Functions), or a Worker's, e.g. orders::create")
    call_p.add_argument("body", nargs="?", default="{}",
                        help="the request: one JSON object (default {}); numbers go as written")
    call_p.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS",
                        help="the call's whole time, and its deadline (default 10)")
    call_p.add_argument("--service", type=_service_name, default="state",
                        help="whose stream gets the call, <prefix>:bus:<service>: state "
                        "(default) or a Worker's service name")
    call_p.add_argument("--context", type=_context, default=None, metavar="JSON",
                        help="the call's context, a JSON object: who calls, for the functions "
                        "that take isolation from it (user_id, dag_name, root_dag_name, "
                        "org_id, workflow_id, execution_id ...)")
    watch_p = sub.add_parser(
        "watch", help="print change events as JSON lines, as they happen",
        description="Print the change events of a scope, a key or every scope as JSON lines "
                    "(new ones, or every one after --from).",
        epilog=WATCH_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    watch_p.add_argument("--scope", default=None, help="only this scope's events")
    watch_p.add_argument("--key", default=None, help="only this key's events (of --scope, or "
                         "of every scope)")
    watch_p.add_argument("--from", dest="from_revision", type=_revision, default=None,
                         metavar="REVISION", help="every event after this revision (an event's "
                         "or a bookmark's); default: only new events")
    sub.add_parser("status", help="Redis, AOF, streams, pending calls, consumers, counters, "
                   "triggers and dispatch lag")
    sub.add_parser("restore", help="rebuild an empty Redis from the PostgreSQL snapshot "
                   "(STATEWORKER_POSTGRES_URL): entries, triggers, claims")
    service_user.add_command(sub)
    admin.add_parsers(sub)
    args = parser.parse_args(argv)
    try:
        check_url(client_url(_settings(args)))  # an unsupported scheme: one line, status 2
        if args.command == "serve":
            return _serve(args)
        if args.command == "acl-rule":
            return service_user.print_rule(args, _settings(args))
        if args.command == "call":
            return int(run(_call, args))
        if args.command == "watch":
            return int(run(_watch, args))
        if args.command == "restore":
            return int(run(_restore, _settings(args)))
        if args.command in ("principal", "role"):
            return int(run(admin.run_admin, _settings(args), args))
        if args.command == "status":
            report = run(status_report, _settings(args))
            print(msgspec.json.encode(report).decode())
            return 0 if report.get("reachable") else 1
    except MissingPermission as exc:  # the service's Redis user: exit 1 (docs/security.md)
        print(f"stateworker: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled command {args.command}")  # argparse allows no other


if __name__ == "__main__":
    sys.exit(main())
