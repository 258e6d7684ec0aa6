"""The state service's own Redis user: the minimal ACL rule `stateworker serve` needs (every
command it runs, by name and subcommand, on `~<prefix>:*`, the reply channels), and the check at
start that the user it runs as has all of it (docs/security.md).

The rule is one table, `_probes`: each command the service runs - in Python or inside its Lua
functions, which Redis checks against the caller's ACL too - with a sample of it on a key the
service really uses. `rule(prefix)` is the `+<command>` of every row; `check` asks Redis with
`ACL DRYRUN <self> <sample>` for every row in one pipeline, so a user that lacks a command the
service runs only rarely (XAUTOCLAIM: a dead replica's calls; the restore commands: a wiped
Redis) is refused at start, not when that day comes. A NOPERM that still comes up during the
start (a permission Redis checks at connect, SELECT) becomes the same one line
(`missing_from`)."""

from __future__ import annotations

import argparse
import re
import shlex
import urllib.parse
from collections.abc import Sequence

from stateworker.errors import MissingPermission, shown
from stateworker.keys import STATE_SERVICE, KeySpace, reply_prefix, stats_key
from stateworker.scripts.library import FCALL
from stateworker.settings import Settings
from stateworker.transport.cluster_map import is_cluster_url, seeds_of
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

RULE_DOC = "docs/security.md"
RULE_COMMAND = "stateworker acl-rule"
DEFAULT_USER = "stateworker"
SERVICE = STATE_SERVICE
_NOPERM_COMMAND = re.compile(r"permissions to run the '([^']+)' command")
_NOPERM_KEY = re.compile(r"permissions to access the '(.*)' key")


def _probes(prefix: str, user: str, *, strict: bool, waitaof: bool, select: bool
            ) -> dict[str, list[Arg]]:
    """Each command of the rule -> a sample of it (the arguments after `ACL DRYRUN <user>`),
    on a key of the kind the service runs it on. Who runs it, beside each."""
    keys = KeySpace(prefix, 1)
    part = keys.partition(0)
    entry, index, events = part.entry("s", "k"), part.key_index("s"), part.events
    bus, reply = keys.bus_stream(SERVICE), f"{reply_prefix(prefix)}c"
    stats = stats_key(prefix, SERVICE)
    probes: dict[str, list[Arg]] = {
        # The start: this check, the wait for a loading Redis, the server checks, the library.
        "acl|whoami": ["ACL", "WHOAMI"],
        "acl|dryrun": ["ACL", "DRYRUN", user, "PING"],
        "ping": ["PING"],
        "info": ["INFO", "persistence"],  # AOF on? a cluster?
        "hget": ["HGET", keys.meta, "partitions"],  # (and the entries' layout; the scripts; a bus
        # condition's client: its service's dedupe window, bus/resends.py)
        "hsetnx": ["HSETNX", keys.meta, "partitions", 1],
        "time": ["TIME"],  # where a new event history begins (compaction.begin_history)
        "function|load": ["FUNCTION", "LOAD", "REPLACE", "#!lua name=probe\n"],
        # A Redis Cluster (transport/cluster.py): its map, and the command an ASK reply asks
        # for. In every rule: `acl-rule` cannot tell whether a URL names a cluster (one node's
        # URL is asked at start), and neither grants a key: the same user serves either way.
        "cluster|shards": ["CLUSTER", "SHARDS"],
        "asking": ["ASKING"],
        # A blocking read of streams in several slots (transport/streamread.py): its reads'
        # connections' ids, and the end of their wait once one answered (own connections).
        "client|id": ["CLIENT", "ID"],
        "client|unblock": ["CLIENT", "UNBLOCK", 0],
        FCALL.lower(): [FCALL, "probe", 1, entry],  # every write, list, lease, reap, trigger ...
        # The registry follower and the dispatcher: the registry stream, triggers, claims.
        "xread": ["XREAD", "COUNT", 1, "STREAMS", keys.registry, "0-0"],
        "xrevrange": ["XREVRANGE", keys.registry, "+", "-", "COUNT", 1],
        "hgetall": ["HGETALL", keys.triggers],  # (and the snapshot: barriers; access)
        "hvals": ["HVALS", keys.triggers],  # a claim: the scopes triggers name
        # The bus runtime: its group, reads, reclaims, replies, acknowledgements, counters.
        "xgroup|create": ["XGROUP", "CREATE", bus, SERVICE, "0", "MKSTREAM"],
        "xreadgroup": ["XREADGROUP", "GROUP", SERVICE, "c", "COUNT", 1, "STREAMS", bus, ">"],
        "xautoclaim": ["XAUTOCLAIM", bus, SERVICE, "c", 1, "0-0"],
        # (inside sweep.lua: a dead consumer, nothing pending, removed; bus/upkeep.py)
        "xinfo|consumers": ["XINFO", "CONSUMERS", bus, SERVICE],
        "xgroup|delconsumer": ["XGROUP", "DELCONSUMER", bus, SERVICE, "c"],
        "get": ["GET", part.lease],  # the status of leases (and the scripts: leases, entries;
        # the snapshot's rows)
        "set": ["SET", part.lease, "t", "NX", "PX", 1],  # (the scripts: a partition's lease)
        "lpush": ["LPUSH", reply, "r"],
        # (the scripts: a reply published on the state's Redis, the bus on one of its own)
        "publish": ["PUBLISH", reply, "r"],
        "pexpire": ["PEXPIRE", reply, 1],  # (and the scripts: records)
        "xack": ["XACK", bus, SERVICE, "0-1"],
        "xdel": ["XDEL", bus, "0-1"],
        "hincrby": ["HINCRBY", stats, "calls", 1],  # (and the dispatcher's, the cut)
        "hset": ["HSET", stats, "flushed_ms", 1],  # (and the scripts, the snapshot, the repair,
        # the mark of the entries' layout: state/kv/repack.py)
        # The functions outside scripts: reads, list_groups, Dagu's create_only check.
        "hmget": ["HMGET", part.dispatched, "id", "n"],  # (and trimming, barriers)
        "zrange": ["ZRANGE", part.scopes, 0, -1],
        "exists": ["EXISTS", entry],
        "strlen": ["STRLEN", entry],  # a query's index path: an entry's size before its value
        # The dispatcher: handler calls, a bus condition's client, leases, trimming.
        "xadd": ["XADD", keys.bus_stream("handler"), "*", "f", "v"],  # (and every event)
        "xlen": ["XLEN", keys.bus_stream("handler")],  # a target's backlog
        "blmpop": ["BLMPOP", 1, 1, reply, "LEFT"],
        "del": ["DEL", reply],  # (and the scripts, the repair)
        "zadd": ["ZADD", keys.replicas, 0, "r"],  # (and the scripts' indexes, the repair)
        "zremrangebyscore": ["ZREMRANGEBYSCORE", keys.replicas, 0, 1],
        "zcard": ["ZCARD", keys.replicas],  # (and the scripts, the repair)
        "zrem": ["ZREM", keys.replicas, "r"],  # (and the scripts)
        "xinfo|stream": ["XINFO", "STREAM", events],
        "xtrim": ["XTRIM", events, "MINID", "~", "0-1"],
        # A restore (the repair at start): a stream made to give ids past those restored.
        "xsetid": ["XSETID", events, "0-1"],
        "xgroup|destroy": ["XGROUP", "DESTROY", events, "restore"],  # (where there is none)
        # The byte bound of the event streams: each held stream measured once a round.
        "memory|usage": ["MEMORY", "USAGE", events, "SAMPLES", 0],
        # /metrics: the backlog of a call stream (its group's, and its oldest pending entry).
        "xinfo|groups": ["XINFO", "GROUPS", bus],
        "xpending": ["XPENDING", bus, SERVICE],
        # The snapshot: the rescan of a partition's entries (its barriers too), changed barriers.
        "scan": ["SCAN", 0, "MATCH", f"{part.entry_prefix}*", "COUNT", 1],
        "srandmember": ["SRANDMEMBER", part.barriers_changed, 1],
        "xrange": ["XRANGE", part.unsaved_calls, "-", "+", "COUNT", 1],  # call records
        "sismember": ["SISMEMBER", part.barriers_changed, "b"],  # a kept reply's barrier stored?
        "sscan": ["SSCAN", keys.dispatch_targets, 0],  # trigger targets' streams (targets.py)
        # Only inside the Lua functions (scripts/lua/).
        "hdel": ["HDEL", keys.claims, "s"],
        "hexists": ["HEXISTS", keys.claims, "s"],
        "hlen": ["HLEN", part.barrier("b")],
        "sadd": ["SADD", part.barriers_changed, "b"],
        "srem": ["SREM", part.barriers_changed, "b"],
        "zcount": ["ZCOUNT", index, 0, 1],
        "zlexcount": ["ZLEXCOUNT", index, "-", "+"],
        "zrangebyscore": ["ZRANGEBYSCORE", part.ttl, 0, 1],
        "zrank": ["ZRANK", index, "k"],
        "unlink": ["UNLINK", part.value_index("s", "/p")],  # (index.lua: a dropped index)
        "incr": ["INCR", part.barrier_writes],  # (barrier.lua: the write numbers)
        "pexpireat": ["PEXPIREAT", part.barrier("b"), 1],  # (a completed barrier; restore)
        # lua/pages.lua: a state::list_entries snapshot handed to the next cursor, its expiry kept
        "rename": ["RENAME", part.snapshot("a"), part.snapshot("b")],
        "pexpiretime": ["PEXPIRETIME", part.snapshot("a")],
        # The console's live tail (app/console.py): a Watch reads a partition in one MULTI.
        "multi": ["MULTI"],
        "exec": ["EXEC"],
        # The upgrade to packed entries (state/kv/repack.py, lua/repack.lua), at start.
        "type": ["TYPE", entry],
        "zremrangebylex": ["ZREMRANGEBYLEX", index, "[a", "+"],
        "zscore": ["ZSCORE", index, "k"],
    }
    if select:  # the URL names a database other than 0
        probes["select"] = ["SELECT", 0]
    if strict:  # lifecycle.check_strict
        probes["config|get"] = ["CONFIG", "GET", "appendfsync"]
        probes["command|info"] = ["COMMAND", "INFO", "WAITAOF"]
        # Every batch confirmed (state/core/confirm.py): by replicas on a cluster (or with
        # STATEWORKER_STRICT_REPLICAS), with WAITAOF on Redis 7.2+.
        probes["wait"] = ["WAIT", 0, 0]
        if waitaof:
            probes["waitaof"] = ["WAITAOF", 1, 0, 0]
    return probes


def rule(prefix: str, *, strict: bool = False, waitaof: bool = False,
         select: bool = False) -> list[str]:
    """The ACL SETUSER arguments (after the user name; a password is added apart, `>...`)
    that let `stateworker serve` on `prefix` run everything it runs, and nothing more: the
    keys `<prefix>:*`, the channels `<prefix>:reply:*` (the scripts publish replies there),
    each command by name. `strict`: the durability
    check (`waitaof`: on Redis 7.2+); `select`: a URL naming a database other than 0."""
    commands = _probes(prefix, DEFAULT_USER, strict=strict, waitaof=waitaof, select=select)
    return ["on", "resetkeys", f"~{prefix}:*", "resetchannels", f"&{reply_prefix(prefix)}*",
            "-@all",
            *(f"+{name}" for name in sorted(commands))]


def selects(url: str | None) -> bool:
    """Whether the connection to `url` sends SELECT (a database other than 0); a Redis
    Cluster's list of seeds: whether one of them does."""
    if url is None:
        return False
    if is_cluster_url(url):
        return any(selects(seed) for seed in seeds_of(url))
    parsed = urllib.parse.urlparse(url)
    query = urllib.parse.parse_qs(parsed.query)
    db = (parsed.path.strip("/") if parsed.scheme != "unix" else "") or query.get("db", ["0"])[0]
    return bool(db) and db != "0"


def rule_for(settings: Settings, *, waitaof: bool = False) -> list[str]:
    return rule(settings.prefix, strict=settings.durability == "strict", waitaof=waitaof,
                select=selects(settings.redis_url))


def setuser_line(args: Sequence[str], user: str = DEFAULT_USER) -> str:
    """The rule as one command line for redis-cli (quoted for a shell)."""
    return shlex.join(["ACL", "SETUSER", user, *args])


def _line(user: str, where: str, missing: Sequence[str]) -> str:
    return (f"the Redis user {shown(user)} at {where} lacks part of the service's ACL rule: "
            f"{', '.join(missing)}; the whole rule is in {RULE_DOC}, or run `{RULE_COMMAND}`")


def _refusal(prefix: str, name: str, text: str) -> str:
    """What a refused probe (or NOPERM) names: `+<command>`, or the key and the pattern."""
    if found := _NOPERM_COMMAND.search(text):
        return f"+{found.group(1)}"
    if found := _NOPERM_KEY.search(text):
        return f"~{prefix}:* (key {shown(found.group(1))})"
    if "key" in text:
        return f"~{prefix}:* (a key of {name})"
    return f"{name} ({text})"


async def check(conn: RedisConnection, settings: Settings, publishes: bool = False) -> None:
    """Raise MissingPermission (one line) when the user `conn` is logged in as lacks part of
    the rule. A Redis that cannot be reached, or refuses the login, is left to the server
    checks that follow (they say so). `publishes`: the scripts publish replies there (the
    state's Redis with the bus on one of its own), so PUBLISH on the reply channels is asked
    too; elsewhere a user without it still serves."""
    strict = settings.durability == "strict"
    try:
        user = (await conn.execute("ACL", "WHOAMI")).decode()
        waitaof = strict and await conn.execute("COMMAND", "INFO", "WAITAOF") != [None]
    except ConnectionLost:
        return
    except ReplyError as exc:
        if "NOPERM" not in str(exc):
            return
        raise MissingPermission(_line(_user_of(settings), conn.shown, [
            _refusal(settings.prefix, "the login", str(exc))])) from None
    probes = _probes(settings.prefix, user, strict=strict, waitaof=waitaof,
                     select=selects(settings.redis_url))
    if not publishes:  # (a rule from before 0059 serves where no reply is published)
        del probes["publish"]
    try:
        replies = await conn.pipeline([["ACL", "DRYRUN", user, *args]
                                       for args in probes.values()])
    except ConnectionLost:
        return
    missing: list[str] = []
    for name, reply in zip(probes, replies, strict=True):
        if reply == b"OK":
            continue
        if isinstance(reply, ReplyError):  # DRYRUN itself refused (NOPERM), or a bad sample
            missing = [_refusal(settings.prefix, "ACL DRYRUN", str(reply))]
            break
        refused = _refusal(settings.prefix, name, reply.decode())
        if refused.startswith("~"):
            if any(m.startswith("~") for m in missing):
                continue  # the pattern once: every keyed command would say it
            refused = f"{refused[:-1]} refused for {name})"
        missing.append(refused)
    if missing:
        raise MissingPermission(_line(user, conn.shown, missing))


def missing_from(error: BaseException, settings: Settings, shown: str) -> MissingPermission | None:
    """A NOPERM anywhere in `error` (its causes, an exception group's members) as the one
    line; None when there is none."""
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, MissingPermission):
            return exc
        if "NOPERM" in str(exc):
            text = str(exc)[str(exc).index("NOPERM"):]
            return MissingPermission(_line(_user_of(settings), shown, [
                _refusal(settings.prefix, "a start-up command", text)]))
        if isinstance(exc, BaseExceptionGroup):
            todo += exc.exceptions
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return None


def _user_of(settings: Settings) -> str:
    url = urllib.parse.urlparse(settings.redis_url or "")
    return urllib.parse.unquote(url.username or "default")


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`stateworker acl-rule`, for cli.main."""
    parser = sub.add_parser(
        "acl-rule", help="print the ACL SETUSER line of the service's own Redis user",
        description="Print the minimal ACL rule `stateworker serve` needs (STATEWORKER_PREFIX, "
                    "STATEWORKER_DURABILITY and the URL's database taken into account) as one "
                    f"redis-cli command line; set its password apart. See {RULE_DOC}.",
        epilog="exit status:\n  0  the line is on stdout\n  2  bad usage or configuration "
               "(arguments, --redis-url, STATEWORKER_* variables)\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--user", default=DEFAULT_USER, help="the ACL user's name "
                        f"(default {DEFAULT_USER})")
    parser.add_argument("--waitaof", action="store_true", help="STATEWORKER_DURABILITY=strict "
                        "on Redis 7.2+: add WAITAOF, which the service then uses")


def print_rule(args: argparse.Namespace, settings: Settings) -> int:
    print(setuser_line(rule_for(settings, waitaof=args.waitaof), args.user))
    return 0
