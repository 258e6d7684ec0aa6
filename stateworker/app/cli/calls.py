"""The commands that call functions over the bus: `call` (any function, JSON in and out) and
the short verbs for people, `get`, `put`, `del`, `ls` and `delete-barrier`, each a call of a
state function (app/cli/verbs.py: scopes, history, triggers). Every one checks first that a
consumer group reads the stream it writes to, so a call to a service nobody serves fails at
once instead of waiting out its timeout."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from stateworker import codec
from stateworker.app.cli.common import EXIT_OK, EXIT_USAGE, print_error, settings_of
from stateworker.app.cli.suggest import function_hint
from stateworker.app.output import cell, listing, wants_table
from stateworker.bus.client import StateClient
from stateworker.errors import StateError, Unavailable, shown
from stateworker.keys import STATE_SERVICE
from stateworker.schemas import ListedEntry, ListEntriesResult, PrefixDeletedResult


async def check_readers(client: StateClient, service: str) -> None:
    """Unavailable when no consumer group reads a stream the client may send to: nothing
    would ever answer (a group is made by the first `stateworker serve`, or Worker, of the
    service), or the service reads fewer shards than the client's STATEWORKER_BUS_SHARDS. A
    Redis user that may not look (acl mode) sends anyway."""
    missing = await client.missing_readers()
    if not missing:
        return
    streams = client.shards.streams
    if len(missing) < len(streams):
        raise Unavailable(
            f"no consumer group reads {', '.join(missing)}: the service {shown(service)} reads "
            f"fewer than this client's {len(streams)} shards (STATEWORKER_BUS_SHARDS must be the "
            "same for the service and its callers); the call was not sent",
            {"streams": missing, "service": service, "shards": len(streams), "sent": False})
    how = ("start the service: ./scripts/run (or `stateworker serve`)" if service == STATE_SERVICE
           else f"start a worker for it: Worker({shown(service)}).serve() in Python, or any "
           "program that serves the stream (docs/bus-protocol.md)")
    raise Unavailable(f"no consumer group reads {client.stream}: nothing serves the service "
                      f"{shown(service)}, the call was not sent; {how}",
                      {"stream": client.stream, "service": service, "sent": False})


@asynccontextmanager
async def connected(args: argparse.Namespace,
                    service: str = STATE_SERVICE) -> AsyncIterator[StateClient]:
    """A client of `service` whose stream a consumer group reads (check_readers), opened
    within `args.timeout` (it waits for a Redis that is restarting)."""
    async with StateClient(settings=settings_of(args), service=service,
                           timeout=args.timeout) as client:
        await check_readers(client, service)
        yield client


async def call_one(args: argparse.Namespace, fn: str, body: bytes,
                   service: str = STATE_SERVICE,
                   context: dict[str, Any] | None = None) -> bytes:
    """One call within `args.timeout` (opening the client, the check and the call); its
    result's JSON. Raises its StateError."""
    end = time.monotonic() + args.timeout
    async with connected(args, service) as client:
        left = max(end - time.monotonic(), 0.001)
        return await client.call_json(fn, body, timeout=left, context=context)


async def run_call(args: argparse.Namespace) -> int:
    """`call FN [BODY]`: the result's JSON on stdout."""
    try:
        result = await call_one(args, args.fn, args.body.encode(), args.service, args.context)
    except StateError as exc:
        return print_error(function_hint(exc, args.fn, args.service))
    print(result.decode())
    return EXIT_OK


async def for_table(args: argparse.Namespace, fn: str, body: bytes) -> bytes | int:
    """One call whose result is shown as a table or as its JSON: the result when a table is
    wanted; else the JSON printed (or the error) and the exit status."""
    try:
        result = await call_one(args, fn, body)
    except StateError as exc:
        return print_error(exc)
    if wants_table(args):
        return result
    print(result.decode())
    return EXIT_OK


def _body(**fields: Any) -> bytes:
    return msgspec.json.encode({k: v for k, v in fields.items() if v is not None})


async def run_get(args: argparse.Namespace) -> int:
    """`get SCOPE KEY`: the value's JSON; a missing key is NOT_FOUND (exit 1)."""
    body = _body(scope=args.scope, key=args.key, required=True)
    try:
        entry = msgspec.json.decode(await call_one(args, "state::get-entry", body),
                                    type=dict[str, msgspec.Raw])
    except StateError as exc:
        return print_error(exc)
    print(bytes(entry["value"]).decode())
    return EXIT_OK


def read_value(text: str) -> bytes | None:
    """VALUE as JSON text (`-`: read from stdin); None (a usage error shown) when not JSON."""
    data = sys.stdin.buffer.read() if text == "-" else text.encode()
    try:
        msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        where = "stdin" if text == "-" else "VALUE"
        # (the decoder's words for these two mislead: "Input data was truncated")
        lone = codec.surrogate_error(data, where) if data.strip() else None
        reason = "it is empty" if not data.strip() else lone.message if lone else str(exc)
        print(f"stateworker put: {where} must be one JSON value (a string is quoted: "
              f"'\"text\"'), got {shown(data.decode(errors='replace')[:200])}: {reason}",
              file=sys.stderr)
        return None
    return data.strip()


async def run_put(args: argparse.Namespace) -> int:
    """`put SCOPE KEY VALUE [--ttl] [--topic] [--if-version]`: state::set; its result's JSON
    (a version that does not match: CONFLICT, exit 1)."""
    value = read_value(args.value)
    if value is None:
        return EXIT_USAGE
    head = _body(scope=args.scope, key=args.key, ttl_ms=args.ttl, topic=args.topic,
                 expected_version=args.if_version)
    body = head[:-1] + b',"value":' + value + b"}"  # the value's text as written
    try:
        print((await call_one(args, "state::set", body)).decode())
    except StateError as exc:
        return print_error(exc)
    return EXIT_OK


async def run_del(args: argparse.Namespace) -> int:
    """`del SCOPE KEY`: state::delete; the old value's JSON (null when there was none).
    `del SCOPE --prefix P`: state::delete-by-prefix until no key is left; `{"deleted": N}`."""
    if (args.key is None) == (args.prefix is None):
        print("stateworker del: give KEY or --prefix (one of them)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.key is not None:
            print((await call_one(args, "state::delete", _body(scope=args.scope,
                                                              key=args.key))).decode())
            return EXIT_OK
        deleted = 0
        async with connected(args) as client:
            while True:  # (each call deletes one batch; `more`: keys with the prefix remain)
                batch = msgspec.json.decode(await client.call_json(
                    "state::delete-by-prefix", _body(scope=args.scope, prefix=args.prefix)),
                    type=PrefixDeletedResult)
                deleted += batch.deleted
                if not batch.more:
                    break
    except StateError as exc:
        return print_error(exc)
    print(msgspec.json.encode({"deleted": deleted}).decode())
    return EXIT_OK


async def run_delete_barrier(args: argparse.Namespace) -> int:
    """`delete-barrier ID`: state::delete-barrier; its JSON result."""
    try:
        print((await call_one(args, "state::delete-barrier", _body(id=args.id))).decode())
    except StateError as exc:
        return print_error(exc)
    return EXIT_OK


async def run_ls(args: argparse.Namespace) -> int:
    """`ls SCOPE`: one page of state::list-entries, as a table or its JSON."""
    body = _body(scope=args.scope, prefix=args.prefix, limit=args.limit, after=args.after,
                 include_values=args.values or None)
    result = await for_table(args, "state::list-entries", body)
    if isinstance(result, int):
        return result
    page = msgspec.json.decode(result, type=ListEntriesResult)  # values as stored (Raw)
    headers = ["KEY", "VERSION", "UPDATED", "TOPIC"] + (["VALUE"] if args.values else [])
    rows = [[e.key, e.version, e.updated_at, e.topic] + (entry_value(e) if args.values else [])
            for e in page.entries]
    keys = "keys" if args.prefix is None else f"keys starting with {shown(args.prefix)}"
    print(listing(headers, rows, f"no {'more ' if args.after else ''}{keys} in scope "
                                 f"{shown(args.scope)}"))
    if isinstance(page.next_after, str):  # (the same listing's next page: its options kept)
        more = ["stateworker", "ls", args.scope, *(["--prefix", args.prefix] if args.prefix
                                                   is not None else []),
                "--limit", str(args.limit), *(["--values"] if args.values else [])]
        print(f"(more: {shlex.join([*more, '--after', page.next_after])})")
    return EXIT_OK


def entry_value(entry: ListedEntry) -> list[str | None]:
    """A listed entry's value as a table's cell (its stored JSON text), in a list to add to
    a row."""
    return [cell(entry.value) if isinstance(entry.value, msgspec.Raw) else None]
