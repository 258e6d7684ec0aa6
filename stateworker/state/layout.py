"""What a prefix's data is laid out, and its services serve, with: checked when a process
opens the prefix and when a service starts, so a setting changed at a restart either works
or is refused (LAYOUT_MISMATCH naming the setting, the stored value and the given one),
never leaves data where the new settings do not look (decisions 0073, 0076).

- **The partition count** is fixed once the prefix exists (`<prefix>:meta` `partitions`,
  claimed with HSETNX: of two processes opening a new prefix at once with other counts, the
  second is refused, `lifecycle.check_server`).
- **What every live service of the prefix shares** (`SHARED`: where the bus is, its shards,
  the durability mode, the auth mode, the snapshot on or off): each `serve` holds its own in
  `<prefix>:serving` (`r:<replica>` -> JSON, renewed every `lease_ms / 5`, gone
  `LIVE_LEASES * lease_ms` after its last renewal, deleted at a clean stop). One that starts
  with another value than a live one's is refused: replicas of one prefix with two bus
  locations hand trigger calls on where half the workers never read, a `fast` one answers a
  `strict` deployment's callers before its replicas hold the write, an `off` one serves the
  shared stream an `acl` deployment closed, one without the snapshot keeps no call record
  for PostgreSQL (a retry after a restore applied twice).
- **Where the bus was** (`<prefix>:serving` `bus`: its Redis, less the credentials, and its
  shards), so a service started with the bus elsewhere, or fewer shards, first checks that
  no trigger call waits unserved where the old settings left it (a target's stream holding
  calls its group has not read or acknowledged): else those calls were never delivered.
"""

from __future__ import annotations

import logging
import secrets
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from stateworker.clock import now_ms
from stateworker.errors import ConfigError, LayoutMismatch, shown
from stateworker.keys import bus_shard_stream
from stateworker.settings import LIVE_LEASES, Settings
from stateworker.state.core.store import RedisState
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection, url_db
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.layout")

BUS_FIELD = "bus"  # in `<prefix>:serving`: where the bus was last (bus_redis_url, bus_shards)
REPLICA = "r:"  # + a service's id: its shared settings while it lives
# Each shared setting: its field, and how the error names it.
SHARED = {
    "bus_redis_url": "bus_redis_url (STATEWORKER_BUS_REDIS_URL)",
    "bus_shards": "bus_shards (STATEWORKER_BUS_SHARDS)",
    "durability": "durability (STATEWORKER_DURABILITY)",
    "auth": "auth (STATEWORKER_AUTH)",
    "postgres_url": "postgres_url (STATEWORKER_POSTGRES_URL: the snapshot on or off)",
}
STATE_REDIS = ""  # `bus`: on the state's own Redis
UNSERVED_SCAN = 1000  # unread calls counted per stream at most (more show as 1000)


def partitions_differ(settings: Settings, stored: int) -> LayoutMismatch:
    """The refusal of a partition count other than the one the prefix was created with."""
    return LayoutMismatch(
        f"prefix {shown(settings.prefix)} was created with {stored} partitions, not "
        f"{settings.partitions} (partitions, STATEWORKER_PARTITIONS): every scope would be "
        "looked for in another partition than the one that holds it, and events and triggers "
        f"would follow other streams; nothing was written. Use STATEWORKER_PARTITIONS={stored} "
        "for this prefix (fixed once its data exists: a restore into another count is not "
        "offered either)", {"setting": "partitions", "stored": stored,
                            "given": settings.partitions, "prefix": settings.prefix})


def bus_home(settings: Settings) -> str:
    """Where the bus is, as stored: STATE_REDIS, or the bus Redis's URL less its credentials
    (never stored; an old bus behind a password cannot be checked: the refusal says how)."""
    if settings.bus_redis_url is None:
        return STATE_REDIS
    parts = urllib.parse.urlsplit(settings.bus_redis_url)
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def shared(settings: Settings) -> dict[str, str]:
    """The settings every live service of a prefix shares, as stored (SHARED)."""
    return {"bus_redis_url": bus_home(settings), "bus_shards": str(settings.bus_shards),
            "durability": settings.durability, "auth": settings.auth,
            "postgres_url": "on" if settings.postgres_url else "off"}


def _shown_value(name: str, value: str) -> str:
    if name == "bus_redis_url" and value == STATE_REDIS:
        return "the state's Redis (unset)"
    return shown(value)


@asynccontextmanager
async def serving(state: RedisState, consumer: str) -> AsyncIterator[None]:
    """A service's shared settings held for the block (`join`, `keep`, `leave`); `consumer`
    names it in a refusal of another's start."""
    replica = secrets.token_hex(6)
    await join(state, replica, consumer)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(keep, state, replica, consumer)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await leave(state, replica)


async def join(state: RedisState, replica: str, consumer: str) -> None:
    """A service's start, before it serves: its shared settings held, then checked against
    every live service's and against where the bus was (`check_bus_moved`).

    Raises:
        LayoutMismatch: a live service serves with another value of a shared setting, or
            the bus moved (or lost shards) while calls wait unserved where it was."""
    conn, keys, settings = state.conn, state.keys, state.settings
    mine = shared(settings)
    now = now_ms()
    bus_id = await _bus_id(state)
    await _hold(state, replica, consumer, mine, bus_id)
    try:
        held = await conn.execute("HGETALL", keys.serving)
        fields = dict(zip(held[::2], held[1::2], strict=True))
        for field, value in fields.items():
            name = field.decode(errors="replace")
            if not name.startswith(REPLICA) or name == REPLICA + replica:
                continue
            other = msgspec.json.decode(value)
            if other["until"] < now:  # (one killed, or stopped without a word: gone)
                await conn.execute("HDEL", keys.serving, field)
                continue
            for setting, theirs in other["settings"].items():
                if setting in mine and _differs(setting, theirs, mine[setting],
                                                other.get("bus_id"), bus_id):
                    raise _live_differs(settings, setting, theirs, mine[setting],
                                        str(other.get("consumer", "")),
                                        int(other["until"]) - now)
        await check_bus_moved(state, fields.get(BUS_FIELD.encode()), mine)
        await conn.execute("HSET", keys.serving, BUS_FIELD, msgspec.json.encode(
            {"bus_redis_url": mine["bus_redis_url"], "bus_shards": settings.bus_shards}))
    except BaseException:
        with anyio.CancelScope(shield=True):
            await leave(state, replica)
        raise


def _differs(setting: str, theirs: str, mine: str, their_bus: str | None,
             my_bus: str | None) -> bool:
    """Whether a live service's value of `setting` is not this one's. The bus by the Redis
    each reaches (`server_id`) where both were read: two URLs of one Redis (a proxy, another
    host name, hosts that name it apart) are one bus, one URL naming two Redis is two (a
    bus Redis restarted in the last renewal's second looks like another one: refused once)."""
    if setting == "bus_redis_url" and their_bus is not None and my_bus is not None:
        return their_bus != my_bus
    return theirs != mine


async def _hold(state: RedisState, replica: str, consumer: str, mine: dict[str, str],
                bus_id: str | None) -> None:
    until = now_ms() + LIVE_LEASES * state.settings.lease_ms
    await state.conn.execute("HSET", state.keys.serving, REPLICA + replica, msgspec.json.encode(
        {"until": until, "consumer": consumer, "settings": mine, "bus_id": bus_id}))


async def keep(state: RedisState, replica: str, consumer: str, *,
               task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """The service's shared settings renewed every `lease_ms / 5` while it runs, with the
    bus's Redis as it answers now (a restart gives it another run id); Redis away: the next
    round (a service frozen past its hold is counted gone, as by the leases)."""
    task_status.started()
    mine = shared(state.settings)
    bus_id = None
    while True:
        await anyio.sleep(state.settings.lease_ms / 5000)
        bus_id = await _bus_id(state) or bus_id
        try:
            await _hold(state, replica, consumer, mine, bus_id)
        except (ConnectionLost, ReplyError, OSError) as exc:
            log.debug("serving settings not renewed: %s", exc)


async def leave(state: RedisState, replica: str) -> None:
    """A clean stop: the service's shared settings no longer held (a kill leaves them until
    they run out)."""
    try:
        await state.conn.execute("HDEL", state.keys.serving, REPLICA + replica)
    except (ConnectionLost, ReplyError, OSError) as exc:
        log.debug("serving settings not removed: %s", exc)


def _live_differs(settings: Settings, setting: str, theirs: str, mine: str, consumer: str,
                  left_ms: int) -> LayoutMismatch:
    return LayoutMismatch(
        f"{SHARED[setting]} is {_shown_value(setting, mine)}, but a live service of prefix "
        f"{shown(settings.prefix)} ({shown(consumer)}) serves with "
        f"{_shown_value(setting, theirs)}: every service of a prefix serves with the same "
        "one. Start this one with the same value, or stop every service of the prefix first "
        f"and start them all with the new one (a service killed counts as live for "
        f"{LIVE_LEASES} lease times after its last renewal: this one's runs out in "
        f"{left_ms / 1000:.1f} s unless it renews it)",
        {"setting": setting, "stored": theirs, "given": mine, "prefix": settings.prefix,
         "consumer": consumer})


async def check_bus_moved(state: RedisState, stored: bytes | None, mine: dict[str, str]) -> None:
    """The bus where it was, or the trigger calls it holds served: a service started with it
    elsewhere (or with fewer shards) hands nothing on there any more, and workers started
    with the new settings never read there. Before any bus was stored: one on the state's
    Redis (the default) when this one's is not."""
    settings = state.settings
    if stored is None:
        if state.created or mine["bus_redis_url"] == STATE_REDIS:
            return
        was: dict[str, Any] = {"bus_redis_url": STATE_REDIS, "bus_shards": settings.bus_shards}
    else:
        was = msgspec.json.decode(stored)
    old_bus, old_shards = str(was["bus_redis_url"]), int(was["bus_shards"])
    if old_bus == mine["bus_redis_url"] and old_shards <= settings.bus_shards:
        return
    if old_bus == mine["bus_redis_url"]:
        setting, shards, conn = "bus_shards", range(settings.bus_shards, old_shards), None
    else:
        setting, shards = "bus_redis_url", range(old_shards)
        conn = state.conn if old_bus == STATE_REDIS else await _reach(state, old_bus)
    own = conn is not None and conn is not state.conn
    old_url = (settings.redis_url or "") if old_bus == STATE_REDIS else old_bus
    try:
        if conn is not None and await _same_server(conn, old_url, state.bus_conn,
                                                   _bus_url(settings)):
            # (the same Redis by another URL: the bus did not move; fewer shards, maybe)
            if old_shards <= settings.bus_shards:
                return
            setting, shards = "bus_shards", range(settings.bus_shards, old_shards)
        unserved = await _unserved(conn or state.bus_conn, state, shards)
    finally:
        if own and conn is not None:
            await conn.close()
    if unserved:
        raise _moved_refused(state, setting, was, mine, unserved)


async def _reach(state: RedisState, url: str) -> RedisConnection:
    settings = state.settings
    conn = connection_for(url, connect_timeout_s=settings.connect_timeout_s,
                          read_timeout_s=settings.read_timeout_s)
    try:
        await conn.execute("PING")
    except (ConnectionLost, ReplyError, ConfigError, OSError) as exc:
        await conn.close()
        raise LayoutMismatch(
            f"{SHARED['bus_redis_url']} is {_shown_value('bus_redis_url', bus_home(settings))}, "
            f"but prefix "
            f"{shown(settings.prefix)} had its bus at {shown(url)}, which cannot be reached to "
            f"check that no trigger call waits there unserved ({exc}): workers started with "
            "the new setting would never read those calls. Make it reachable (without a "
            "password) and start again, or start with the bus where it was until its workers "
            "served them; if they are to be dropped (that Redis is gone), delete the record: "
            f"HDEL {state.keys.serving} {BUS_FIELD}",
            {"setting": "bus_redis_url", "stored": url, "given": bus_home(settings),
             "prefix": settings.prefix}) from exc
    return conn


def _bus_url(settings: Settings) -> str:
    return settings.bus_redis_url or settings.redis_url or ""


async def _bus_id(state: RedisState) -> str | None:
    """The bus Redis of its own's `server_id`; None on the state's Redis (every service says
    so alike, whatever URL it names the state's Redis by: a cluster's seeds, say)."""
    return await server_id(state.bus_conn, _bus_url(state.settings)) if state.split_bus else None


async def server_id(conn: RedisConnection, url: str) -> str | None:
    """Which redis-server's database `conn` (to `url`) reaches: its run id, asked now, and
    the database the URL selects; None when it does not answer."""
    try:
        info = await conn.execute("INFO", "server")
    except (ConnectionLost, ReplyError, OSError):
        return None
    run = next((line for line in info.split(b"\r\n") if line.startswith(b"run_id:")), None)
    return None if run is None else f"{run[7:].decode()}/{url_db(url)}"


async def _same_server(conn: RedisConnection, url: str, other: RedisConnection,
                       other_url: str) -> bool:
    """Whether two connections (to `url`, `other_url`) reach one redis-server's database."""
    mine = await server_id(conn, url)
    return mine is not None and mine == await server_id(other, other_url)


async def _unserved(conn: RedisConnection, state: RedisState, shards: range) -> dict[str, int]:
    """Calls each trigger target's streams (`shards` of them) hold that its group has not
    read or not acknowledged, by stream (at most UNSERVED_SCAN each); the targets are those
    the dispatcher gave a group there (`dispatch_targets`)."""
    prefix, found = state.settings.prefix, {}
    targets: set[str] = set()
    cursor = b"0"
    while True:  # (SSCAN: the command the service's ACL rule has for this set)
        cursor, names = await conn.execute("SSCAN", state.keys.dispatch_targets, cursor)
        targets.update(name.decode() for name in names)
        if cursor == b"0":
            break
    for service in sorted(targets):
        for shard in shards:
            stream = bus_shard_stream(prefix, service, shard)
            count = await _stream_unserved(conn, stream, service)
            if count:
                found[stream] = count
    return found


async def _stream_unserved(conn: RedisConnection, stream: str, group: str) -> int:
    try:
        groups = await conn.execute("XINFO", "GROUPS", stream)
    except ReplyError:  # (no such stream)
        return 0
    info: dict[bytes, Any] = next((dict(zip(g[::2], g[1::2], strict=True)) for g in groups
                                   if dict(zip(g[::2], g[1::2], strict=True))[b"name"]
                                   == group.encode()), {})
    after = info.get(b"last-delivered-id", b"0-0").decode()
    unread = await conn.execute("XRANGE", stream, f"({after}", "+", "COUNT", UNSERVED_SCAN)
    return len(unread) + int(info.get(b"pending", 0))


def _moved_refused(state: RedisState, setting: str, was: dict[str, Any], mine: dict[str, str],
                   unserved: dict[str, int]) -> LayoutMismatch:
    settings = state.settings
    stored = str(was[setting])
    where = ", ".join(f"{stream}: {n}" for stream, n in unserved.items())
    back = (f"STATEWORKER_BUS_SHARDS={stored}" if setting == "bus_shards"
            else f"STATEWORKER_BUS_REDIS_URL={stored}" if stored
            else "STATEWORKER_BUS_REDIS_URL unset")
    return LayoutMismatch(
        f"{SHARED[setting]} is {_shown_value(setting, mine[setting])}, but prefix "
        f"{shown(settings.prefix)} served with {_shown_value(setting, stored)}, and trigger "
        f"calls wait unserved there ({where}): with the new setting they would never be "
        f"delivered; nothing was written. Start with {back} (workers too) until they are "
        "served (`stateworker status`), then stop every service and worker and start them "
        "with the new setting; or, to drop those calls, delete those streams",
        {"setting": setting, "stored": stored, "given": mine[setting],
         "prefix": settings.prefix, "unserved": unserved})
