"""`stateworker watch [SCOPE [KEY]]`: change events as JSON lines, as they happen; bookmarks
only with `--progress` (as etcdctl's `--progress-notify`). The watch itself always gets them
(events/watch.py sends them after a quiet while): without `--progress` the command uses each
one only to notice that its reader went away (`| head -n 2`), so it exits then too."""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from typing import BinaryIO

import anyio

from stateworker.app.cli.common import EXIT_OK, EXIT_USAGE, print_error, settings_of
from stateworker.errors import ConfigError, InvalidRequest, StateError, shown
from stateworker.events.model import Bookmark, bookmark_json, document_json, parse_revision
from stateworker.events.watch import Watch
from stateworker.transport.embedded import client_url


def revision(text: str) -> str:
    try:
        parse_revision(text, "--from")
    except InvalidRequest as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def scope_and_key(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """SCOPE and KEY, given by position or by --scope / --key (not both, unless equal)."""
    picked = []
    for name, positional, option in (("scope", args.scope, args.scope_option),
                                     ("key", args.key, args.key_option)):
        if positional is not None and option is not None and positional != option:
            raise ConfigError(f"watch: {name} given twice, as {shown(positional)} and "
                              f"--{name} {shown(option)}: give it once")
        picked.append(positional if positional is not None else option)
    return picked[0], picked[1]


async def run_watch(args: argparse.Namespace) -> int:
    """Print the watch's lines until SIGINT/SIGTERM (status 0) or an error (WATCH_EPILOG)."""
    try:
        scope, key = scope_and_key(args)
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as tg:
            async def stop_on_signal() -> None:
                async for _ in signals:
                    tg.cancel_scope.cancel()

            async def print_items() -> None:
                nonlocal status
                status = await print_watch(args, scope, key, sys.stdout.buffer)
                tg.cancel_scope.cancel()

            tg.start_soon(stop_on_signal)
            tg.start_soon(print_items)
    return status


async def print_watch(args: argparse.Namespace, scope: str | None, key: str | None,
                      out: BinaryIO) -> int:
    settings = settings_of(args)
    try:
        async with Watch(client_url(settings), settings, scope=scope, key=key,
                         from_revision=args.from_revision) as watch:
            async for item in watch:
                if isinstance(item, Bookmark):
                    if not args.progress:
                        if reader_gone(out):
                            break
                        continue
                    out.write(bookmark_json(item))
                elif args.prefix is None or item.key.startswith(args.prefix):
                    out.write(document_json(item))
                else:
                    continue
                out.write(b"\n")
                out.flush()  # a line as soon as it happens, also into a pipe
    except StateError as exc:
        return print_error(exc)
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (`| head`): done, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # nothing left to flush there
    return EXIT_OK


def reader_gone(out: BinaryIO) -> bool:
    """Whether stdout is a pipe whose reader has closed it (nothing written to tell)."""
    poll = select.poll()
    poll.register(out.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
