"""`stateworker principal ...` and `stateworker role ...`: the administration of `acl` mode
(docs/security.md, "Principals and roles"). They talk to Redis directly, as the operator (the
URL's user must be allowed ACL SETUSER / DELUSER; the embedded default user is).

Each prints one JSON document on stdout; errors are {code, message, details} on stderr.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from stateworker.app.output import table, wants_table
from stateworker.clock import rfc3339_ms
from stateworker.engines.catalog import CATALOG
from stateworker.errors import ConfigError, Conflict, NotFound, StateError, Unavailable, shown
from stateworker.keys import principal_own_streams_pattern
from stateworker.settings import Settings
from stateworker.state import lifecycle
from stateworker.state.core.grants import BUILTIN
from stateworker.state.core.store import RedisState
from stateworker.state.tenancy import principals as p
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import shown_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost, ReplyError

POLL_S = 0.1  # how often `principal remove` looks at the streams it waits for


def _failed(error: StateError) -> int:
    print(msgspec.json.encode(error.to_dict()).decode(), file=sys.stderr)
    return 1


async def run_admin(settings: Settings, args: argparse.Namespace) -> int:
    """Run one `principal` / `role` verb; its exit status."""
    verb = VERBS[(args.command, args.verb)]
    try:
        async with lifecycle.open_state(settings=settings, reaper=False) as state:
            state.access.serve(CATALOG.specs)  # (roles may name the engines' functions)
            result = await verb(state, args)
    except ConfigError as exc:
        if not isinstance(exc.__cause__, ConnectionLost):
            raise
        # no Redis: UNAVAILABLE, status 1, as every other command says it (not a usage error)
        return _failed(Unavailable(str(exc), {"redis": shown_url(client_url(settings))}))
    except StateError as exc:
        return _failed(exc)
    except (ReplyError, ConnectionLost) as exc:  # NOPERM: the URL's user may not manage users
        print(f"stateworker: Redis refused {args.command} {args.verb}: {exc} (the operator's "
              "user needs ACL SETUSER, DELUSER, GETUSER)", file=sys.stderr)
        return 1
    if isinstance(result, int):
        return result
    if (args.command, args.verb) == ("principal", "list") and wants_table(args):
        print(principals_table(result["principals"]), flush=True)
        return 0
    print(msgspec.json.encode(result).decode(), flush=True)
    return 0


def principals_table(principals: list[dict[str, Any]]) -> str:
    return table(["NAME", "ROLES", "ACT AS", "ACL USER", "CREATED"],
                 [[p["name"], ",".join(p["roles"]), ",".join(p["act_as"]) or None,
                   "yes" if p["acl_user"] else "MISSING", rfc3339_ms(p["created_ms"])]
                  for p in principals])


def _password(args: argparse.Namespace) -> str:
    if not args.password_stdin:
        return secrets.token_urlsafe(32)
    text = sys.stdin.readline().rstrip("\r\n")
    if not text or any(c.isspace() for c in text):
        raise SystemExit("stateworker: --password-stdin: one line, no spaces, not empty")
    return text


def _saved(state_saved: bool) -> bool:
    if not state_saved:
        print("stateworker: note: Redis has no aclfile, so ACL users live until redis-server "
              "restarts (configure `aclfile`, docs/security.md, 'Principals and roles')",
              file=sys.stderr)
    return state_saved


async def _refuse_existing_user(state: RedisState, name: str, replace: bool) -> None:
    """A principal's ACL user is made for it: an existing user (the service's, an operator's,
    another program's) is not silently turned into one (its rules and passwords would be
    replaced: the service would then fail with WRONGPASS). `--replace` takes one over, but
    never `default` nor the user this command runs as."""
    whoami = (await state.conn.execute("ACL", "WHOAMI")).decode()
    if name in ("default", whoami):
        who = "the default user" if name == "default" else "the Redis user this command " \
            "connects as"
        raise Conflict(f"principal {shown(name)}: {shown(name)} is {who}; a principal's ACL "
                       "user is its own: choose another name; nothing was written",
                       {"name": name, "acl_user": "protected"})
    if await state.conn.execute("HEXISTS", state.keys.principals, name):
        return  # (a principal of that name: the add's own CONFLICT says so)
    if not replace and await p.has_user(state, name):
        raise Conflict(f"principal {shown(name)}: Redis already has an ACL user {shown(name)} "
                       "(another program's, or the service's own?); `principal add` would "
                       "replace its rules and passwords. Choose another name, or give "
                       "--replace if that user is to become this principal's; nothing was "
                       "written", {"name": name, "acl_user": "exists"})


async def principal_add(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    await _refuse_existing_user(state, args.name, args.replace)
    password = _password(args)
    record = await p.add_principal(state, args.name, args.roles, args.act_as)
    await p.set_user(state, args.name, password)  # last: the service knows it, its stream is there
    shown = {"principal": args.name, "roles": list(record.roles), "act_as": list(record.act_as),
             "acl_saved": _saved(await p.save_acl(state))}
    if not args.password_stdin:
        shown["password"] = password  # printed once: Redis keeps only its hash
    return shown


async def principal_list(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    stored, _ = await p.stored(state)
    return {"principals": [
        {"name": name, "roles": list(r.roles), "act_as": list(r.act_as),
         "created_ms": r.created_ms, "acl_user": await p.has_user(state, name)}
        for name, r in sorted(stored.items())]}


async def principal_passwd(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    stored, _ = await p.stored(state)
    if args.name not in stored:
        raise NotFound(f"principal {shown(args.name)} does not exist (`principal add`)",
                       {"name": args.name})
    password = _password(args)
    await p.set_password(state, args.name, password)
    result: dict[str, Any] = {"principal": args.name, "acl_saved": _saved(await p.save_acl(state))}
    if not args.password_stdin:
        result["password"] = password
    return result


async def principal_remove(state: RedisState, args: argparse.Namespace) -> dict[str, Any] | int:
    """ACL DELUSER first (its connections are closed, no new call comes) and the record
    rotated (every replica ends its console sessions and proven HTTP credentials: they are
    tied to the record, which stays while the streams drain), then wait until every stream
    of the principal is served and acknowledged, then drop the record (every replica stops
    reading its streams) and the streams. A name that is no principal but is a Redis user
    (the service's own, an operator's, another program's) is refused, nothing deleted: its
    ACL user is not a principal's to remove (its connections would be closed, for good)."""
    stored, _ = await p.stored(state)
    if args.name not in stored and await p.has_user(state, args.name):
        raise NotFound(f"principal {shown(args.name)} does not exist, and the Redis user "
                       f"{shown(args.name)} is none's (the service's own, an operator's, "
                       "another program's?): `principal remove` deletes only a principal's "
                       "user; nothing was deleted", {"name": args.name, "acl_user": "exists"})
    await state.conn.execute("ACL", "DELUSER", args.name)
    await p.rotate(state, args.name)
    _saved(await p.save_acl(state))
    streams = await _streams_of(state, args.name)
    end = time.monotonic() + args.timeout
    shown_at = 0.0
    while waiting := [s for s in streams if not await _drained(state, s)]:
        left = end - time.monotonic()
        if left <= 0:
            print(f"stateworker: principal {shown(args.name)}: {', '.join(waiting)} still has calls "
                  f"not served after {args.timeout:g} s (is the service running?); its ACL user "
                  "is deleted, run `principal remove` again to finish", file=sys.stderr)
            return 1
        if time.monotonic() - shown_at >= 1.0:
            print(f"waiting for the service to serve {', '.join(waiting)} ({left:.0f} s left)",
                  file=sys.stderr, flush=True)
            shown_at = time.monotonic()
        await anyio.sleep(POLL_S)
    dropped, kept = await p.drop_registered(state, args.name)
    existed = await p.remove_principal(state, args.name)
    # One DEL each: on a Redis Cluster the streams are in different slots.
    for stream, reply in zip(streams, await state.conn.pipeline([["DEL", s] for s in streams]),
                             strict=True):
        if isinstance(reply, ReplyError):
            raise StateError(f"principal {shown(args.name)}: could not delete {stream}: {reply}")
    return {"principal": args.name, "removed": existed, "streams_deleted": streams,
            "triggers_unregistered": dropped, "scopes_kept_private": kept}


async def _streams_of(state: RedisState, name: str) -> list[str]:
    """The principal's streams (one per service), on every primary of a Redis Cluster (a
    SCAN reaches one node; the streams' names have no hash tag, so they are anywhere)."""
    pattern = principal_own_streams_pattern(state.settings.prefix, name)
    if isinstance(state.conn, ClusterConnection):
        names = await state.conn.scan_every_primary("MATCH", pattern, "TYPE", "stream",
                                                    "COUNT", 1000)
        return sorted({n.decode() for n in names})
    found: list[str] = []
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH", pattern, "TYPE",
                                                 "stream", "COUNT", 1000)
        found += [n.decode() for n in names]
        if cursor in (b"0", "0"):
            return sorted(set(found))


def _id(text: bytes | str) -> tuple[int, int]:
    ms, _, seq = (text.decode() if isinstance(text, bytes) else text).partition("-")
    return int(ms), int(seq or 0)


async def _drained(state: RedisState, stream: str) -> bool:
    """Every entry of `stream` delivered to each group and acknowledged (none pending). A
    stream without a group is read by nobody: nothing to wait for (its entries go with it)."""
    info, groups = await state.conn.pipeline([["XINFO", "STREAM", stream],
                                              ["XINFO", "GROUPS", stream]])
    if isinstance(info, Exception):  # gone already
        return True
    fields = dict(zip(info[::2], info[1::2], strict=True))
    last = _id(fields[b"last-generated-id"])
    if not groups:
        return True
    for flat in groups:
        group = dict(zip(flat[::2], flat[1::2], strict=True))
        if int(group[b"pending"]) or _id(group[b"last-delivered-id"]) < last:
            return False
    return True


async def role_add(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    allow = [item for text in args.allow for item in text.split(",") if item]
    role, replaced = await p.add_role(state, args.name, allow, args.scopes, args.read_only,
                                      args.services)
    return {"role": args.name, "replaced": replaced, **msgspec.to_builtins(role)}


async def role_list(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    """The built-in roles and the stored ones, read now (STORE_LOST on a Redis that lost the
    registry: the copy in memory would list the built-in roles alone)."""
    _, stored = await p.stored(state)
    return {"roles": [{"name": name, "builtin": name in BUILTIN, **msgspec.to_builtins(role)}
                      for name, role in sorted({**stored, **BUILTIN}.items())]}


async def role_remove(state: RedisState, args: argparse.Namespace) -> dict[str, Any]:
    return {"role": args.name, "removed": await p.remove_role(state, args.name)}


Verb = Callable[[RedisState, argparse.Namespace], Any]
VERBS: dict[tuple[str, str], Verb] = {
    ("principal", "add"): principal_add, ("principal", "list"): principal_list,
    ("principal", "remove"): principal_remove, ("principal", "passwd"): principal_passwd,
    ("role", "add"): role_add, ("role", "list"): role_list, ("role", "remove"): role_remove,
}
