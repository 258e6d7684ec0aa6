"""The `stateworker` command: serve, call, status, bench."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import anyio
import msgspec

from stateworker.api import StateStore
from stateworker.errors import ConfigError, StateError


async def _status(store: StateStore) -> dict[str, Any]:
    conn = store.state.conn
    info = (await conn.execute("INFO", "persistence")).decode()
    aof = "aof_enabled:1" in info
    groups = await store.list_groups()
    return {
        "redis": store.state.conn.url,
        "embedded": store.state.embedded is not None,
        "aof": aof,
        "prefix": store.settings.prefix,
        "partitions": store.settings.partitions,
        "scopes": len(groups),
    }


async def serve(args: argparse.Namespace) -> None:
    async with StateStore.open(args.redis_url) as store:
        print(msgspec.json.encode({"serving": await _status(store)}).decode(), flush=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                print(f"received {signal.Signals(signum).name}, stopping", file=sys.stderr)
                return


async def call(args: argparse.Namespace) -> int:
    async with StateStore.open(args.redis_url, reaper=False) as store:
        try:
            result = await store.call_json(args.fn, args.body.encode())
        except StateError as exc:
            print(msgspec.json.encode(exc.to_dict()).decode(), file=sys.stderr)
            return 1
        print(result.decode())
        return 0


async def status(args: argparse.Namespace) -> None:
    async with StateStore.open(args.redis_url, reaper=False) as store:
        print(msgspec.json.encode(await _status(store)).decode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stateworker", description=__doc__)
    parser.add_argument("--redis-url", default=None,
                        help="Redis to use (default: STATEWORKER_REDIS_URL, else embedded)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the service until SIGINT/SIGTERM")
    call_p = sub.add_parser("call", help="call one function and print its JSON result")
    call_p.add_argument("fn")
    call_p.add_argument("body", nargs="?", default="{}")
    sub.add_parser("status", help="print Redis and store status as JSON")
    bench_p = sub.add_parser("bench", help="benchmark against raw redis-py, as ratios")
    bench_p.add_argument("--seconds", type=float, default=2.0)
    bench_p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            anyio.run(serve, args)
        elif args.command == "call":
            return int(anyio.run(call, args))
        elif args.command == "status":
            anyio.run(status, args)
        else:
            from stateworker import bench

            bench.main(args.seconds, args.rounds)
    except ConfigError as exc:
        print(f"stateworker: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
