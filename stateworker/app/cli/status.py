"""`stateworker status`: the report (JSON, whose shape other tools and the compose health check
rely on) and its summary for people: services, pending calls, lag and the snapshot, the
partitions collapsed into one line each for the dispatch and the snapshot."""

from __future__ import annotations

import argparse
from typing import Any

from stateworker.app.cli.common import EXIT_FAILED, EXIT_OK, print_json, settings_of
from stateworker.app.output import table, wants_table
from stateworker.clock import rfc3339_ms
from stateworker.keys import KeySpace, bus_streams_pattern, stats_key
from stateworker.reactive.status import dispatch_status
from stateworker.settings import Settings
from stateworker.snapshot.status import snapshot_status
from stateworker.transport.connect import connection_for
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.embedded import client_url
from stateworker.transport.wire import ConnectionLost, ReplyError


async def status_report(settings: Settings) -> dict[str, Any]:
    """Redis, AOF, the bus streams with their pending calls and consumers, the counters, and
    the dispatch: triggers, replicas, per-partition holders, lag and cuts; the snapshot:
    per-partition lag (events, ms) and its last error (null: no snapshot ran)."""
    url = client_url(settings)
    conn = connection_for(url)
    report: dict[str, Any] = {"redis": shown_url(url), "state_dir": None if settings.redis_url
                              else settings.state_dir, "prefix": settings.prefix}
    try:
        info = (await conn.execute("INFO", "persistence")).decode()
    except ConnectionLost as exc:
        report.update(reachable=False, error=str(exc))
        return report
    try:
        report.update(reachable=True, aof="aof_enabled:1" in info, services={})
        cursor = b"0"
        streams: list[bytes] = []
        while True:
            cursor, found = await conn.execute("SCAN", cursor, "MATCH",
                                               bus_streams_pattern(settings.prefix),
                                               "TYPE", "stream", "COUNT", 1000)
            streams += found
            if cursor in (b"0", "0"):
                break
        for stream in sorted(streams):
            name = stream.decode().rsplit(":", 1)[-1]
            report["services"][name] = await _service_status(conn, stream, name, settings)
        keys = KeySpace(settings.prefix, settings.partitions)
        report["dispatch"] = await dispatch_status(conn, keys)
        report["snapshot"] = await snapshot_status(conn, keys)
    finally:
        await conn.close()
    return report


async def _service_status(conn: RedisConnection, stream: bytes, group: str,
                          settings: Settings) -> dict[str, Any]:
    length = await conn.execute("XLEN", stream)
    try:
        pending = await conn.execute("XPENDING", stream, group)
        consumers = await conn.execute("XINFO", "CONSUMERS", stream, group)
    except ReplyError:  # no group yet: nobody has served this stream
        pending, consumers = [0], []
    flat = await conn.execute("HGETALL", stats_key(settings.prefix, group))
    counters = {k.decode(): int(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
    flushed = counters.pop("flushed_ms", None)
    return {
        "stream_length": length,
        "pending": pending[0],
        "consumers": [_pairs(c) for c in consumers],
        "counters": counters,
        # The service adds its counts every FLUSH_EVERY_S: they are this old at most.
        "counters_as_of": rfc3339_ms(flushed),
    }


def _pairs(flat: list[Any]) -> dict[str, Any]:
    return {k.decode(): (v.decode() if isinstance(v, bytes) else v)
            for k, v in zip(flat[::2], flat[1::2], strict=True)}


async def run_status(args: argparse.Namespace) -> int:
    """The report as JSON or its summary; 0 when Redis answered, else 1."""
    report = await status_report(settings_of(args))
    if wants_table(args):
        print(summary(report), flush=True)
    else:
        print_json(report)
    return EXIT_OK if report.get("reachable") else EXIT_FAILED


def summary(report: dict[str, Any]) -> str:
    """The report for people: a line per part, a table of the services."""
    where = report["state_dir"] or "(an external Redis)"
    lines = [f"redis      {report['redis']}", f"state dir  {where}",
             f"prefix     {report['prefix']}"]
    if not report.get("reachable"):
        return "\n".join([*lines, f"reachable  no: {report.get('error')}"])
    lines.append(f"reachable  yes, AOF {'on' if report['aof'] else 'OFF'}")
    services = report["services"]
    rows = [[name, s["pending"], len(s["consumers"]), s["stream_length"],
             s["counters"].get("calls", "-"), s["counters_as_of"]]
            for name, s in services.items()]
    lines.append("services" + ("   (none: no stream yet)" if not rows else ""))
    if rows:
        shown = table(["  SERVICE", "PENDING", "CONSUMERS", "STREAM", "CALLS", "COUNTED AS OF"],
                      [[f"  {r[0]}", *r[1:]] for r in rows])
        lines += shown.splitlines()
    dispatch = report["dispatch"]
    lines.append(f"dispatch   {dispatch['triggers']} trigger(s), {len(dispatch['replicas'])} "
                 f"replica(s), {partitions_line(dispatch['partitions'])}")
    snapshot = report["snapshot"]
    if snapshot is None:
        lines.append("snapshot   off (no STATEWORKER_POSTGRES_URL)")
    else:
        error = snapshot["last_error"]
        lines.append(f"snapshot   {partitions_line(snapshot['partitions'])}, last error: "
                     + (f"{error} ({snapshot['last_error_ms_ago']} ms ago)" if error else "none"))
    return "\n".join(lines)


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
