"""Opening and closing a `RedisState`: the embedded redis-server when no URL is set, the
server checks (AOF, the partition count of the prefix), the script library (`connect`), the
registry follower (which loads the claims before the state is handed out) and the TTL reaper
(`running`), the clock and the eviction policy followed while it runs; `open_state` is both."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from stateworker.errors import ConfigError, shown
from stateworker.events.compaction import begin_history
from stateworker.settings import Settings
from stateworker.state import expiry, generation, layout
from stateworker.state.core.confirm import Confirm
from stateworker.state.core.store import RedisState
from stateworker.state.kv import repack
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.connection import RedisConnection
from stateworker.transport.embedded import EmbeddedRedis
from stateworker.transport.redis_clock import follow_clock, sync_clock
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.state")
EVICTION_CHECK_S = 10.0  # how often a running service asks whether Redis may evict its keys


async def connect(settings: Settings,
                  ready: Callable[[RedisConnection], Awaitable[None]] | None = None
                  ) -> RedisState:
    """Start (or adopt) the embedded Redis when no URL is set, check it, load the scripts.
    `ready(conn)` runs first, on the state's own connection (the state service waits out a
    Redis that is loading there, so the wait costs no connection of its own)."""
    embedded = None
    url = settings.redis_url
    if url is None:
        embedded = EmbeddedRedis(Path(settings.state_dir), settings.appendfsync)
        await embedded.start()
        url = embedded.url
    conn = connection_for(url, connect_timeout_s=settings.connect_timeout_s,
                          read_timeout_s=settings.read_timeout_s)
    try:
        if ready is not None:
            await ready(conn)
        # One URL may name a Redis Cluster node: asked once, here, and routed by slot if so.
        conn = await probed(conn)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await conn.close()
            if embedded is not None:
                await embedded.stop()
        raise
    state = RedisState(settings, conn, embedded)
    if settings.bus_redis_url is not None:  # (connected on its first use)
        state.bus_conn = connection_for(settings.bus_redis_url,
                                        connect_timeout_s=settings.connect_timeout_s,
                                        read_timeout_s=settings.read_timeout_s)
    try:
        await sync_clock(conn)  # (before anything takes the time: the checks, the upgrade)
        await check_server(state)
        await state.library.load()
        await repack.upgrade(state)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await state.close()
        raise
    return state


@asynccontextmanager
async def open_state(redis_url: str | None = None, *, reaper: bool = True,
                     **overrides: Any) -> AsyncIterator[RedisState]:
    """Open a state (settings from the environment, overridden by keywords, or `settings=`)
    with its registry follower (claims loaded before it is yielded) and its reaper. With no
    Redis URL (argument or STATEWORKER_REDIS_URL) an embedded redis-server is started under
    `state_dir` and stopped again when the block ends."""
    settings = overrides.pop("settings", None) or Settings.from_env(redis_url=redis_url,
                                                                    **overrides)
    async with running(await connect(settings), reaper=reaper) as state:
        yield state


@asynccontextmanager
async def running(state: RedisState, *, reaper: bool = True,
                  before: Callable[[RedisState], Awaitable[None]] | None = None
                  ) -> AsyncIterator[RedisState]:
    """A state from `connect` with its registry follower and reaper for the block; closed
    when it ends, or when `before` or a start fails. `before(state)` runs before the follower
    loads the claims (the repair at start: what it restores is what they are loaded from)."""
    try:
        if before is not None:
            await before(state)
        async with anyio.create_task_group() as tg:
            await tg.start(state.registry.run)
            await tg.start(generation.watch_loop, state)
            await tg.start(clock_loop, state)
            await tg.start(eviction_loop, state)
            if reaper:
                await tg.start(expiry.reaper_loop, state)
            try:
                yield state
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The caller's own error comes out of the block as itself, not wrapped in a group.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        with anyio.CancelScope(shield=True):
            await state.close()


async def clock_loop(state: RedisState, *,
                     task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """The process's time kept on the state's Redis's clock (transport/redis_clock.py)."""
    task_status.started()
    await follow_clock(state.conn)


async def check_server(state: RedisState) -> None:
    """AOF on (unless allowed off), the durability mode's fsync, and the prefix's partition
    count unchanged."""
    conn, settings, keys = state.conn, state.settings, state.keys
    try:
        info = await conn.execute("INFO", "persistence")
        # (On a cluster every script keeps to one slot; see RedisState.cluster.)
        state.cluster = b"cluster_enabled:1" in await conn.execute("INFO", "cluster")
    except (ConnectionLost, ReplyError) as exc:
        raise ConfigError(f"Redis at {conn.shown} is not usable: {exc}") from exc
    aof_on = b"aof_enabled:1" in info
    if not aof_on and not settings.allow_no_aof:
        raise ConfigError(
            f"Redis at {conn.shown} has AOF off (appendonly no): acknowledged writes could be "
            "lost. Turn it on (CONFIG SET appendonly yes) or set STATEWORKER_ALLOW_NO_AOF=true "
            "to accept that risk."
        )
    if settings.durability == "strict":
        await check_strict(state)
    await check_eviction(state)
    stored = await conn.execute("HGET", keys.meta, "partitions")
    if stored is None:
        state.created = True
        # A new history of events begins (compaction.py): a watch resumed from before it
        # gets COMPACTED. Recorded first, so no event is written before it.
        await begin_history(conn, keys, "new")
        if not await conn.execute("HSETNX", keys.meta, "partitions", keys.partitions):
            # Another process opened the prefix meanwhile: its count holds (decision 0073).
            # Two opened at once with 4 and 8 partitions both wrote, each in its own layout.
            stored = await conn.execute("HGET", keys.meta, "partitions")
            if int(stored) != keys.partitions:
                await _drop_histories(state, int(stored))
                raise layout.partitions_differ(settings, int(stored))
        if settings.postgres_url is None:
            if (await generation.read(conn, keys)).may_begin:  # (not a Redis found wiped)
                await generation.begin(conn, keys)
        else:  # (new, or wiped? PostgreSQL knows: the repair at start asks it, or a restore)
            await generation.defer(conn, keys)
    elif int(stored) != keys.partitions:
        raise layout.partitions_differ(settings, int(stored))
    else:
        await _markers_at_start(state)


async def _drop_histories(state: RedisState, partitions: int) -> None:
    """A count refused after `begin_history` wrote its partitions' history hashes: those
    past the prefix's own count are no partition's (the ones below are shared: kept)."""
    extra = state.keys.all_partitions()[partitions:]
    if extra:
        await state.conn.pipeline([["DEL", p.history] for p in extra])


async def _markers_at_start(state: RedisState) -> None:
    """A prefix this Redis held before: one from before the generation marker gets it; with
    no PostgreSQL snapshot, markers gone (a cluster node that came back empty) are begun anew
    (generation.check says so in the log); with one, the repair at start decides."""
    markers = await generation.read(state.conn, state.keys)
    if markers.meta is None and markers.may_begin:
        await generation.begin(state.conn, state.keys)
    elif state.settings.postgres_url is None:
        await generation.check(state)


async def check_bus(state: RedisState) -> None:
    """The bus on a Redis of its own (STATEWORKER_BUS_REDIS_URL): neither side may be a
    Redis Cluster (the fused path's routing and a cluster's reply lists per node assume the
    state's map; docs/decisions/0056). A bus Redis away is left to the bus's start, which
    waits for it and says so."""
    settings = state.settings
    if settings.bus_redis_url is None:
        return
    if state.cluster:
        raise ConfigError(
            f"bus_redis_url (STATEWORKER_BUS_REDIS_URL) cannot be used with a Redis Cluster: "
            f"the state's Redis at {state.conn.shown} is one; unset it, or use one Redis server "
            "for the state")
    try:
        info = await state.bus_conn.execute("INFO", "cluster")
    except (ConnectionLost, ReplyError):
        return
    if b"cluster_enabled:1" in info:
        raise ConfigError(
            f"bus_redis_url (STATEWORKER_BUS_REDIS_URL) must name one Redis server, not a "
            f"Redis Cluster node ({state.bus_conn.shown}); unset it to keep the bus on the "
            "state's Redis")


async def check_strict(state: RedisState) -> None:
    """`strict`: Redis fsyncs the AOF before it replies (`appendfsync always`: the embedded
    Redis is switched to it, an external one must be configured so), and where the server has
    WAITAOF (7.2+) every batch is confirmed with it as well; on a cluster (or when
    STATEWORKER_STRICT_REPLICAS asks) with WAIT for replicas too (`state.confirm`)."""
    conn = state.conn
    try:
        fsyncs = await _appendfsync(conn)
    except ReplyError as exc:
        raise ConfigError(
            f"Redis at {conn.shown} refused CONFIG GET appendfsync ({exc}), so "
            "STATEWORKER_DURABILITY=strict cannot check that writes are fsynced before the "
            "reply: allow CONFIG GET for this user, or use STATEWORKER_DURABILITY=fast") from exc
    wrong = {node: fsync for node, fsync in fsyncs.items() if fsync != "always"}
    if wrong and state.embedded is not None:
        await conn.execute("CONFIG", "SET", "appendfsync", "always")  # our own server: adopted
    elif wrong:
        node, fsync = next(iter(wrong.items()))
        raise ConfigError(
            f"STATEWORKER_DURABILITY=strict needs Redis at {node} to fsync every write "
            f"before it replies, but its appendfsync is {shown(fsync)}: set `appendfsync always` "
            "(CONFIG SET appendfsync always, and in redis.conf; on a cluster on every node, "
            "replicas too), or use STATEWORKER_DURABILITY=fast")
    try:
        waitaof = (await conn.execute("COMMAND", "INFO", "WAITAOF")) != [None]
    except ReplyError:  # COMMAND refused (ACL): appendfsync always alone, as on Redis < 7.2
        waitaof = False
    replicas = state.settings.strict_replicas
    if replicas is None:  # a cluster's primaries each have a replica to promote: use it
        replicas = 1 if state.cluster else 0
    state.confirm = Confirm(waitaof=waitaof, replicas=replicas)


async def check_eviction(state: RedisState) -> bool:
    """Redis must not evict keys of its own accord. `maxmemory-policy allkeys-*` would drop
    entries silently (and a write over one would start its version at 1 again); a
    `volatile-*` policy with a `maxmemory` set evicts the keys that have an expiry, and those
    are what exactly-once stands on: the call records (a retried call id applied again: 8
    writes of 100 KB at the limit evicted 24 keys, the record of a call among them, and its
    retry wrote version 2), the completed barriers, the dispatcher's leases, the reply
    lists. With no `maxmemory` (0) nothing is ever evicted. The bus's Redis of its own too
    (its reply lists and a `Worker`'s records; away now: its start waits for it). Read from
    INFO memory (the service's ACL rule has no CONFIG); refused (an ACL of the operator's):
    not checked. Whether every node answered (a node loading, or away, is not checked)."""
    conn = state.conn
    try:
        if isinstance(conn, ClusterConnection):
            infos = await conn.on_every_primary("INFO", "memory")
        else:
            infos = {conn.shown: await conn.execute("INFO", "memory")}
    except ReplyError:
        return False
    if state.split_bus:
        with contextlib.suppress(ReplyError, ConnectionLost):
            infos[state.bus_conn.shown] = await state.bus_conn.execute("INFO", "memory")
    answered = True
    for node, info in infos.items():
        if not isinstance(info, bytes):
            answered = False
            continue
        fields = dict(line.split(":", 1) for line in info.decode(errors="replace").splitlines()
                      if ":" in line)
        policy = fields.get("maxmemory_policy", "noeviction").strip()
        limit = fields.get("maxmemory", "0").strip()
        if policy.startswith("allkeys-"):
            raise ConfigError(
                f"Redis at {node} evicts any key when it is full (maxmemory-policy {policy}): "
                "it would drop entries without a word, and the next write of one would begin "
                "its version at 1 again. Set `maxmemory-policy noeviction` (CONFIG SET, and in "
                "redis.conf; on a cluster on every node): a full Redis then refuses writes "
                "(RESOURCE_EXHAUSTED) instead")
        if policy != "noeviction" and limit not in ("", "0"):
            raise ConfigError(
                f"Redis at {node} evicts keys that have an expiry when it reaches its maxmemory "
                f"({limit} bytes, maxmemory-policy {policy}): the service's call records, "
                "completed barriers and leases have one, and a call retried after its record "
                "was evicted would be applied twice. Set `maxmemory-policy noeviction` "
                "(CONFIG SET, and in redis.conf; on a cluster on every node): a full Redis "
                "then refuses writes (RESOURCE_EXHAUSTED) instead")
    return answered


async def eviction_loop(state: RedisState, *,
                        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """`check_eviction` again every EVICTION_CHECK_S: a policy that may evict set while the
    service runs (CONFIG SET) refused no start. It keeps `state.evicting` (why Redis may
    evict the service's keys, or None): `/readyz` answers 503 with it, and the log says it
    once. Writes go on (a call is applied twice only once Redis is full and evicts a record
    it retries: refusing every write at once would turn the slip into an outage)."""
    task_status.started()
    while True:
        await anyio.sleep(EVICTION_CHECK_S)
        try:
            if not await check_eviction(state) and state.evicting is not None:
                continue  # (a node that did not answer may still evict: not ready yet)
            problem = None
        except ConfigError as exc:
            problem = str(exc)
        except OSError:  # (Redis away: ConnectionLost, a timeout; the next round)
            continue
        if problem != state.evicting:
            if problem is None:
                log.warning("Redis evicts no key of the service any more: ready again",
                            extra={"event": "redis.eviction_ended"})
            else:
                log.error("%s (set while the service runs: /readyz answers 503 until it is "
                          "fixed)", problem, extra={"event": "redis.evicts"})
            state.evicting = problem


async def _appendfsync(conn: RedisConnection) -> dict[str, str]:
    """Each primary's appendfsync (one server: its own), by node."""
    if isinstance(conn, ClusterConnection):
        replies = await conn.on_every_primary("CONFIG", "GET", "appendfsync")
    else:
        replies = {conn.shown: await conn.execute("CONFIG", "GET", "appendfsync")}
    fsyncs = {}
    for node, reply in replies.items():
        if isinstance(reply, ReplyError):
            raise reply
        fsyncs[node] = dict(zip(reply[::2], reply[1::2], strict=True)).get(
            b"appendfsync", b"").decode()
    return fsyncs


def fsync_guard(state: RedisState) -> str:
    """What makes a reply wait for the disk, for the start log line."""
    if state.settings.durability == "fast":
        return "appendfsync everysec"
    return state.confirm.describe()
