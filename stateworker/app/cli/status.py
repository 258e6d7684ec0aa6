"""`stateworker status`: the report (JSON, whose shape other tools and the compose health check
rely on) and its summary for people: services, pending calls, lag and the snapshot, the
partitions collapsed into one line each for the dispatch and the snapshot."""

from __future__ import annotations

import argparse
from typing import Any

from stateworker.app.cli.common import EXIT_FAILED, EXIT_OK, print_json, settings_of
from stateworker.app.output import table, wants_table
from stateworker.bus.stats import WINDOW_FIELD
from stateworker.clock import rfc3339_ms
from stateworker.errors import ConfigError
from stateworker.keys import KeySpace, bus_shard_of_stream, bus_streams_pattern, stats_key
from stateworker.reactive.status import dispatch_status, trigger_status
from stateworker.settings import Settings
from stateworker.snapshot.status import snapshot_status
from stateworker.state import generation
from stateworker.state.query import indexes
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost, ReplyError

# A call waiting longer than this (unread, or read and not acknowledged) flags its service as
# stalled (the report's `stalled`, the console's services): a served call takes milliseconds.
STALL_MS = 60_000


async def status_report(settings: Settings, conn: RedisConnection | None = None,
                        bus: RedisConnection | None = None) -> dict[str, Any]:
    """Redis, AOF, the bus streams with their pending calls and consumers, the counters, and
    the dispatch: triggers, replicas, per-partition holders, lag and cuts; the snapshot:
    per-partition lag (events, ms) and its last error (null: no snapshot ran). `conn`: a
    running service's own connection (the console's overview), used and left open; else
    one is opened to the settings' Redis and closed. The services come from the bus's
    Redis: `bus` (the service's), else STATEWORKER_BUS_REDIS_URL's (`bus_redis` in the
    report), else the state's."""
    url = client_url(settings)
    report: dict[str, Any] = {"redis": shown_url(url), "state_dir": None if settings.redis_url
                              else settings.state_dir, "prefix": settings.prefix}
    if settings.bus_redis_url is not None:
        report["bus_redis"] = shown_url(settings.bus_redis_url)
    if conn is not None:
        try:
            return await _filled(report, conn, settings, bus=bus)
        except ConnectionLost as exc:
            report.update(reachable=False, error=str(exc))
            return report
    conn = connection_for(url)
    try:
        info = await conn.execute("INFO", "persistence")
    except ConnectionLost as exc:
        await conn.close()  # (whatever it opened on the way)
        report.update(reachable=False, error=str(exc))
        return report
    try:
        conn = await probed(conn)  # (one URL naming a cluster node: the whole cluster)
    except ConfigError as exc:  # (gone since INFO answered)
        await conn.close()
        report.update(reachable=False, error=str(exc))
        return report
    bus = None if settings.bus_redis_url is None else connection_for(settings.bus_redis_url)
    try:
        return await _filled(report, conn, settings, info, bus)
    except ConnectionLost as exc:  # (the bus's Redis away: the state's answered)
        if bus is None:
            raise
        report.update(reachable=False, error=str(exc))
        return report
    finally:
        await conn.close()
        if bus is not None:
            await bus.close()


async def _filled(report: dict[str, Any], conn: RedisConnection, settings: Settings,
                  info: bytes | None = None, bus: RedisConnection | None = None
                  ) -> dict[str, Any]:
    """`report` with what Redis says (`info`: its INFO persistence, when read already;
    ConnectionLost: Redis went away meanwhile; `bus`: the bus's own Redis, if any)."""
    if info is None:
        info = await conn.execute("INFO", "persistence")
    report.update(reachable=True, aof=b"aof_enabled:1" in info, services={})
    bus = bus or conn
    streams = await _bus_streams(bus, settings.prefix)
    for name, shards in _by_service(settings.prefix, streams).items():
        report["services"][name] = await _service_status(bus, shards, name, settings)
    keys = KeySpace(settings.prefix, settings.partitions)
    # Why writes are refused (STORE_LOST: the generation markers, state/generation.py); null
    # when they are not. A prefix this Redis never held has no markers and is not lost.
    markers = await generation.read(conn, keys)
    report["store_lost"] = markers.problem() if markers.held else None
    report["dispatch"] = await dispatch_status(conn, keys)
    report["triggers"] = await trigger_status(conn, keys, report["dispatch"]["partitions"])
    report["snapshot"] = await snapshot_status(conn, keys)
    report["indexes_building"] = await indexes.building(conn, keys)
    return report


async def _bus_streams(conn: RedisConnection, prefix: str) -> list[bytes]:
    """Every call stream of the prefix. On a Redis Cluster they are on every primary (each
    shard of a service on its partition's node; a service's shard 0 wherever its name
    hashes), and a SCAN reaches one: every primary is scanned."""
    scan = ("MATCH", bus_streams_pattern(prefix), "TYPE", "stream", "COUNT", 1000)
    if isinstance(conn, ClusterConnection):
        return sorted(set(await conn.scan_every_primary(*scan)))
    cursor: Any = b"0"
    streams: list[bytes] = []
    while True:
        cursor, found = await conn.execute("SCAN", cursor, *scan)
        streams += found
        if cursor in (b"0", "0"):
            return streams


def _by_service(prefix: str, streams: list[bytes]) -> dict[str, dict[int, bytes]]:
    """The call streams found, by service and shard (STATEWORKER_BUS_SHARDS: a service's
    shards are one service here). A principal's stream (`acl` mode) is named by its tail."""
    services: dict[str, dict[int, bytes]] = {}
    for stream in sorted(streams):
        text = stream.decode()
        service, shard = bus_shard_of_stream(prefix, text)
        if ":from:" in service:
            service, shard = text.rsplit(":", 1)[-1], 0
        services.setdefault(service, {})[shard] = stream
    return services


async def _service_status(conn: RedisConnection, streams: dict[int, bytes], group: str,
                          settings: Settings) -> dict[str, Any]:
    """One service: its streams' entries, pending calls and consumers added up; with more
    than one shard, `shards` lists each one's length, pending calls and lag (entries the
    group has not read yet: XINFO GROUPS `lag`, null when Redis cannot tell)."""
    shards = []
    consumers: dict[str, dict[str, Any]] = {}
    now_ms = await _redis_ms(conn)
    oldest_unread: int | None = None  # the stream-id time of the oldest entry not read yet
    oldest_pending: int | None = None  # ... of the oldest read but not acknowledged
    for shard, stream in sorted(streams.items()):
        length = await conn.execute("XLEN", stream)
        try:
            pending = await conn.execute("XPENDING", stream, group)
            found = await conn.execute("XINFO", "CONSUMERS", stream, group)
            groups = [_pairs(g) for g in await conn.execute("XINFO", "GROUPS", stream)]
        except ReplyError:  # no group yet: nobody has served this stream
            pending, found, groups = [0], [], []
        mine = next((g for g in groups if g.get("name") == group), None)
        lag = None if mine is None else mine.get("lag")
        # An entry the group has not read: the first after its last delivered id (a stream
        # no group reads yet: its first entry).
        after = "-" if mine is None else "(" + str(mine.get("last-delivered-id", "0-0"))
        first = await conn.execute("XRANGE", stream, after, "+", "COUNT", 1)
        if first:
            oldest_unread = _earliest(oldest_unread, first[0][0])
        if pending[0]:
            oldest_pending = _earliest(oldest_pending, pending[1])
        shards.append({"shard": shard, "stream": stream.decode(), "stream_length": length,
                       "pending": pending[0], "lag": lag, "read": bool(groups)})
        for consumer in map(_pairs, found):  # a replica reads every shard: one consumer
            had = consumers.setdefault(consumer["name"], consumer)
            if had is not consumer:
                had["pending"] += consumer.get("pending", 0)
                for field in ("idle", "inactive"):
                    if isinstance(consumer.get(field), int) and isinstance(had.get(field), int):
                        had[field] = min(had[field], consumer[field])
    flat = await conn.execute("HGETALL", stats_key(settings.prefix, group))
    counters = {k.decode(): int(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    flushed = counters.pop("flushed_ms", None)
    counters.pop(WINDOW_FIELD, None)  # (told to clients, not counted: bus/stats.py)
    report = {
        "stream_length": sum(s["stream_length"] for s in shards),
        "pending": sum(s["pending"] for s in shards),
        "consumers": list(consumers.values()),
        "counters": counters,
        # The service adds its counts every FLUSH_EVERY_S: they are this old at most.
        "counters_as_of": rfc3339_ms(flushed),
        "oldest_unread_ms": _age(now_ms, oldest_unread),
        "oldest_pending_ms": _age(now_ms, oldest_pending),
    }
    report["stalled"] = stalled(report, shards)
    if len(shards) > 1:
        report["shards"] = shards
    return report


def stalled(service: dict[str, Any], shards: list[dict[str, Any]]) -> str | None:
    """Why a service looks stalled (None: it does not): calls wait and no consumer reads
    them, or the oldest call waiting (unread, or read and not acknowledged) is older than
    STALL_MS. An idle service with nothing waiting is never stalled."""
    unread = sum(s["lag"] if s["lag"] is not None else 0 if s["read"] else s["stream_length"]
                 for s in shards)
    unread = max(unread, 1 if service["oldest_unread_ms"] is not None else 0)
    if unread and not service["consumers"]:
        return f"{unread} call(s) wait and no consumer reads this stream"
    live = [c for c in service["consumers"] if isinstance(c.get("idle"), int)]
    idle = f"; its consumers idle {min(c['idle'] for c in live) // 1000} s" if live else ""
    for age, what in ((service["oldest_unread_ms"], "unread"),
                      (service["oldest_pending_ms"], "read and not acknowledged")):
        if age is not None and age > STALL_MS:
            return f"a call {what} for {age // 1000} s{idle}"
    return None


async def _redis_ms(conn: RedisConnection) -> int:
    """Redis's clock (the stream ids' clock), in ms."""
    seconds, micros = await conn.execute("TIME")
    return int(seconds) * 1000 + int(micros) // 1000


def _earliest(known: int | None, entry_id: Any) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    ms = int(text.split("-", 1)[0])
    return ms if known is None else min(known, ms)


def _age(now_ms: int, since_ms: int | None) -> int | None:
    return None if since_ms is None else max(0, now_ms - since_ms)


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return {k.decode(): (v.decode() if isinstance(v, bytes) else v)
            for k, v in zip(flat[::2], flat[1::2], strict=True)}


async def run_status(args: argparse.Namespace) -> int:
    """The report as JSON or its summary; 0 when Redis answered and has not lost the data
    (STORE_LOST), else 1."""
    report = await status_report(settings_of(args))
    if wants_table(args):
        print(summary(report), flush=True)
    else:
        print_json(report)
    return EXIT_OK if report.get("reachable") and not report.get("store_lost") else EXIT_FAILED


def summary(report: dict[str, Any]) -> str:
    """The report for people: a line per part, a table of the services."""
    where = report["state_dir"] or "(an external Redis)"
    lines = [f"redis      {report['redis']}", f"state dir  {where}",
             f"prefix     {report['prefix']}"]
    if not report.get("reachable"):
        return "\n".join([*lines, f"reachable  no: {report.get('error')}"])
    lines.append(f"reachable  yes, AOF {'on' if report['aof'] else 'OFF'}")
    if report.get("store_lost"):
        lines.append(f"STORE LOST writes are refused: {report['store_lost']}; recover with "
                     "`stateworker restore`")
    services = report["services"]
    rows = [[name, s["pending"], len(s["consumers"]), s["stream_length"],
             s["counters"].get("calls", "-"), mean_ms(s["counters"]), s["counters_as_of"]]
            for name, s in services.items()]
    lines.append("services" + ("   (none: no stream yet)" if not rows else ""))
    if rows:
        shown = table(["  SERVICE", "PENDING", "CONSUMERS", "STREAM", "CALLS", "MEAN MS",
                       "COUNTED AS OF"],
                      [[f"  {r[0]}", *r[1:]] for r in rows])
        lines += shown.splitlines()
        lines += [f"  {name}: {shards_line(s['shards'])}" for name, s in services.items()
                  if "shards" in s]
        lines += [f"  {name}: STALLED: {s['stalled']}" for name, s in services.items()
                  if s.get("stalled")]
    dispatch = report["dispatch"]
    lines.append(f"dispatch   {dispatch['triggers']} trigger(s), {len(dispatch['replicas'])} "
                 f"replica(s), {partitions_line(dispatch['partitions'])}")
    triggers = [[f"  {t['id']}", t["function_id"], t["service"], t["scope"] or "(every scope)",
                 t["lag_events"], "-" if t["lag_ms"] is None else t["lag_ms"], t["delivered"],
                 "-" if t["last_error"] is None else t["last_error"]["code"]]
                for t in report.get("triggers", [])]
    if triggers:
        lines.append("triggers")
        lines += table(["  ID", "FUNCTION", "SERVICE", "SCOPE", "LAG", "LAG MS", "CALLS",
                        "LAST ERROR"], triggers).splitlines()
    snapshot = report["snapshot"]
    if snapshot is None:
        lines.append("snapshot   off (no STATEWORKER_POSTGRES_URL)")
    else:
        error = snapshot["last_error"]
        lines.append(f"snapshot   {partitions_line(snapshot['partitions'])}, last error: "
                     + (f"{error} ({snapshot['last_error_ms_ago']} ms ago)" if error else "none"))
    lines += [f"indexing   {b['scope']} {b['pointer']}: {b['indexed']}/{b['total']} keys "
              "(state::create-index again resumes it)" for b in report.get("indexes_building", [])]
    return "\n".join(lines)


def mean_ms(counters: dict[str, int]) -> str:
    """The mean latency of the calls counted, in ms ("-" before the first)."""
    calls = counters.get("calls", 0)
    return f"{counters.get('latency_us_sum', 0) / calls / 1000:.2f}" if calls else "-"


def shards_line(shards: list[dict[str, Any]]) -> str:
    """A sharded service's shards in one line: "3 shards, pending 0/2/0, lag 0/0/0" (and
    the shards no consumer group reads)."""
    def each(field: str) -> str:
        return "/".join("-" if s[field] is None else str(s[field]) for s in shards)

    text = f"{len(shards)} shards, pending {each('pending')}, lag {each('lag')}"
    unread = [str(s["shard"]) for s in shards if not s["read"]]
    if unread:
        text += f", not read: shard {', '.join(unread)} (STATEWORKER_BUS_SHARDS differs?)"
    return text


def partitions_line(partitions: list[dict[str, Any]]) -> str:
    """Every partition in one line: "16 partitions, lag 0" (and what stands out)."""
    lag = sum(p["lag_events"] for p in partitions)
    text = f"{len(partitions)} partitions, lag {lag}"
    if lag:
        worst = max(partitions, key=lambda p: p["lag_ms"] or 0)
        text += f" event(s) (oldest {worst['lag_ms']} ms, partition {worst['partition']})"
    unheld = [p["partition"] for p in partitions if p["holder"] is None]
    if unheld:
        text += f", {len(unheld)} not held"
    cut = sum(p.get("cut_events", 0) for p in partitions)
    if cut:
        text += f", {cut} event(s) cut before dispatch"
    return text
