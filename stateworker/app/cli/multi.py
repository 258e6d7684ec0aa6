"""The commands over several keys of a scope: `txn` (a `state::transaction` from a JSON file
or stdin) and `query` (one page of `state::query`, its `where` items written as
`POINTER OP [VALUE]`), each one call over the bus, as a table or its JSON."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

import msgspec

from stateworker.app.cli.calls import entry_value, for_table
from stateworker.app.cli.common import EXIT_OK, EXIT_USAGE
from stateworker.app.output import listing, table
from stateworker.errors import shown
from stateworker.schemas import QueryResult

QUERY_OPS = ("eq", "ne", "lt", "lte", "gt", "gte", "in", "exists", "prefix")


def _usage(command: str, problem: str) -> int:
    print(f"stateworker {command}: {problem}", file=sys.stderr)
    return EXIT_USAGE


def transaction_body(scope: str, text: bytes) -> bytes | str:
    """The request of `txn`: FILE's JSON is the list of ops, or an object with `ops` (and
    `compare`, `else_ops`, `max_keys`); the scope is the argument's. Values stay as written.
    A problem: its text."""
    try:
        given = msgspec.json.decode(text, type=list[msgspec.Raw] | dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"the transaction must be a JSON list of ops, or an object with ops: {exc}"
    if isinstance(given, list):
        return msgspec.json.encode({"scope": scope, "ops": given})
    named = given.get("scope")
    if named is not None and msgspec.json.decode(named) != scope:
        return f"the file names scope {bytes(named).decode()}, the command {shown(scope)}"
    return msgspec.json.encode({**given, "scope": scope})


async def run_txn(args: argparse.Namespace) -> int:
    """`txn SCOPE [FILE]`: state::transaction; its result as a table or its JSON."""
    try:
        with (sys.stdin.buffer if args.file == "-" else open(args.file, "rb")) as source:
            text = source.read()
    except OSError as exc:
        return _usage("txn", f"cannot read {args.file}: {exc.strerror}")
    body = transaction_body(args.scope, text)
    if isinstance(body, str):
        return _usage("txn", body)
    result = await for_table(args, "state::transaction", body)
    if isinstance(result, int):
        return result
    done = msgspec.json.decode(result, type=dict[str, Any])
    rows = [[r["op"], r["key"], r["version"], _outcome(r)] for r in done["results"]]
    print(table(["OP", "KEY", "VERSION", "OUTCOME"], rows))
    print(f"({done['branch']} ran; revision {done['revision']}; tx {done['tx']})")
    return EXIT_OK


def _outcome(result: dict[str, Any]) -> str:
    if result["op"] == "check":
        return "held"
    if result["op"] == "delete":
        return "deleted" if result["deleted"] else "absent"
    return "created" if result.get("created") else "written"


def where_item(text: str) -> dict[str, Any] | str:
    """`POINTER OP [VALUE]` (VALUE one JSON value; `exists` alone means exists: true) as a
    `where` item; a problem: its text."""
    pointer, _, rest = text.strip().partition(" ")
    op, _, value = rest.strip().partition(" ")
    if op not in QUERY_OPS:
        return (f"--where {shown(text)}: expected POINTER OP [VALUE] with OP one of "
                f"{', '.join(QUERY_OPS)}, got {shown(op)}")
    if not value.strip():
        if op != "exists":
            return f"--where {shown(text)}: {op} needs a JSON VALUE after it"
        return {"pointer": pointer, "op": op, "value": True}
    try:
        return {"pointer": pointer, "op": op, "value": msgspec.json.decode(value.strip().encode(),
                                                                         type=msgspec.Raw)}
    except msgspec.DecodeError:
        return f"--where {shown(text)}: VALUE must be JSON (a string is quoted: '\"open\"')"


async def run_query(args: argparse.Namespace) -> int:
    """`query SCOPE --where ...`: one page of state::query, as a table or its JSON."""
    where = [where_item(text) for text in args.where]
    for item in where:
        if isinstance(item, str):
            return _usage("query", item)
    body = msgspec.json.encode({"scope": args.scope, "where": where, "limit": args.limit,
                                **({"after": args.after} if args.after else {})})
    result = await for_table(args, "state::query", body)
    if isinstance(result, int):
        return result
    page = msgspec.json.decode(result, type=QueryResult)  # values as stored (Raw)
    rows = [[e.key, e.version, e.updated_at, *entry_value(e)] for e in page.entries]
    print(listing(["KEY", "VERSION", "UPDATED", "VALUE"], rows,
                  f"no {'more ' if args.after else ''}entries of scope {shown(args.scope)} "
                  "match"))
    if isinstance(page.next_after, str):
        more = ["stateworker", "query", args.scope, "--limit", str(args.limit)]
        for text in args.where:
            more += ["--where", text]
        print(f"(more: {shlex.join([*more, '--after', page.next_after])})")
    return EXIT_OK
