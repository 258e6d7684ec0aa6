"""The commands that run the server side: `serve` (the state service until SIGINT/SIGTERM)
and `restore` (Redis rebuilt from the PostgreSQL snapshot). Their own module, imported only by
them: the service, its HTTP face and psycopg are most of the command's start time."""

from __future__ import annotations

import argparse
import sys

import msgspec
import psycopg

from stateworker import logs, tracing
from stateworker.app import service
from stateworker.app.cli.common import EXIT_FAILED, EXIT_OK, settings_of
from stateworker.bus.protocol import BusOptions
from stateworker.errors import ConfigError, StateError, Unavailable
from stateworker.keys import KeySpace
from stateworker.loop import run, tune_gc_for_serving
from stateworker.settings import Settings
from stateworker.snapshot import repair, restore
from stateworker.snapshot.snapshotter import connect
from stateworker.state import lifecycle
from stateworker.transport.wire import ConnectionLost


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
        pg = await connect(settings.postgres_url)  # (one connection for the checks and all)
        try:
            # (before Redis is opened: a refused restore leaves no layout of its own there)
            await repair.refuse_other_partitions(pg, KeySpace(settings.prefix,
                                                              settings.partitions),
                                                 settings.prefix)
            async with lifecycle.open_state(settings=settings, reaper=False) as state:
                await repair.refuse_healthy(state, pg)
                summary = await restore.restore(state, settings.postgres_url, progress, pg=pg)
        finally:
            await pg.close()
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


def run_restore(args: argparse.Namespace) -> int:
    return int(run(restore_all, settings_of(args)))
