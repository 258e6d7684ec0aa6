"""The short verbs that look around: `scopes` (state::list-namespaces), `history SCOPE KEY`
(a key's recent changes, read from its partition's event stream as the console's history is)
and `triggers ls|add|rm` (state::list-triggers, register-trigger, unregister-trigger;
`list-triggers` is `triggers ls`). Each prints a table on a terminal, else JSON; an empty
listing says so in a table and keeps its JSON shape."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from stateworker.app.cli.calls import call_one, for_table
from stateworker.app.cli.common import EXIT_OK, print_error, print_json, settings_of
from stateworker.app.output import cell, listing, wants_table
from stateworker.errors import ConfigError, StateError, Unavailable, shown
from stateworker.events.history import HISTORY_SCAN, history_document
from stateworker.events.model import EventDocument
from stateworker.keys import KeySpace
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.connection import shown_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost, ReplyError


async def run_scopes(args: argparse.Namespace) -> int:
    """`scopes [--pattern GLOB]`: state::list-namespaces, as a table or its JSON."""
    body = msgspec.json.encode({"limit": args.limit, **(
        {"pattern": args.pattern} if args.pattern is not None else {})})
    result = await for_table(args, "state::list-namespaces", body)
    if isinstance(result, int):
        return result
    names = msgspec.json.decode(result, type=dict[str, list[str]])["namespaces"]
    print(listing(["SCOPE"], [[name] for name in names], "no scopes" if args.pattern is None
                  else f"no scopes match {shown(args.pattern)}"))
    return EXIT_OK


async def run_history(args: argparse.Namespace) -> int:
    """`history SCOPE KEY`: the key's recent changes (events/history.py), newest first."""
    settings = settings_of(args)
    url = client_url(settings)
    conn = connection_for(url)
    try:
        conn = await probed(conn)  # (one URL naming a cluster node: the whole cluster)
        document = await history_document(conn, KeySpace(settings.prefix, settings.partitions),
                                          args.scope, args.key)
    except (ConnectionLost, ReplyError, ConfigError) as exc:
        return print_error(Unavailable(f"history: Redis did not answer: {exc}",
                                       {"redis": shown_url(url)}))
    finally:
        await conn.close()
    if not wants_table(args):
        print_json(document)
        return EXIT_OK
    events = [msgspec.json.decode(raw, type=EventDocument) for raw in document["events"]]
    rows = [[e.revision, e.ts, e.event_type.removeprefix("state:"), e.version,
             cell(e.old_value if e.event_type.endswith("deleted") else e.new_value)]
            for e in events]
    print(listing(["REVISION", "TIME", "EVENT", "VERSION", "VALUE"], rows,
                  f"no changes of key {shown(args.key)} in scope {shown(args.scope)} among the "
                  f"last {HISTORY_SCAN} events of its partition"))
    return EXIT_OK


class _Listed(msgspec.Struct):
    """A registered trigger as the table shows it: its filters' values as stored (Raw)."""

    id: str
    service: str
    function_id: str
    config: dict[str, msgspec.Raw]
    created_at: str


class _Triggers(msgspec.Struct):
    triggers: list[_Listed]


async def run_list_triggers(args: argparse.Namespace) -> int:
    """`triggers ls` (and `list-triggers`): state::list-triggers, as a table or its JSON."""
    result = await for_table(args, "state::list-triggers", b"{}")
    if isinstance(result, int):
        return result
    listed = msgspec.json.decode(result, type=_Triggers).triggers
    rows = [[t.id, t.service, t.function_id, _filters(t.config), t.created_at] for t in listed]
    print(listing(["ID", "SERVICE", "FUNCTION", "FILTERS", "CREATED"], rows, "no triggers"))
    return EXIT_OK


def _filters(config: dict[str, msgspec.Raw]) -> str:
    return " ".join(f"{name}={cell(value)}" for name, value in config.items()
                    if bytes(value) != b"null") or "(every event)"


async def run_triggers(args: argparse.Namespace) -> int:
    """`triggers ls|add|rm`: the verb's call; `add` and `rm` print its result (JSON)."""
    if args.verb == "ls":
        return await run_list_triggers(args)
    if args.verb == "add":
        fn, body = "state::register-trigger", _registration(args)
    else:
        fn, body = "state::unregister-trigger", {"id": args.id}
    try:
        print((await call_one(args, fn, msgspec.json.encode(body))).decode())
    except StateError as exc:
        return print_error(exc)
    return EXIT_OK


def _registration(args: argparse.Namespace) -> dict[str, Any]:
    """state::register-trigger's request from `triggers add`'s options (those given)."""
    config = {"scope": args.scope, "key": args.key, "key_prefix": args.key_prefix,
              "event_types": args.event_types}
    given = {"function_id": args.function, "service": args.service, "id": args.id,
             "config": {name: value for name, value in config.items() if value is not None},
             "ttl_ms": args.ttl}
    return {name: value for name, value in given.items() if value is not None}
