"""What `stateworker status` shows of the snapshot: per partition its holder, the position
PostgreSQL acknowledged (mirrored in Redis) and the lag behind the stream in events and ms;
the snapshotters' last error, last commit and replicas. Read from Redis only, so it shows
while PostgreSQL is down (that is when the lag matters)."""

from __future__ import annotations

from typing import Any

from stateworker.clock import now_ms
from stateworker.keys import KeySpace
from stateworker.reactive.trimming import StreamInfo, id_key
from stateworker.transport.connection import RedisConnection


async def snapshot_status(conn: RedisConnection, keys: KeySpace) -> dict[str, Any] | None:
    """None when no snapshot ever ran for this prefix."""
    now = now_ms()
    flat, replicas = await conn.pipeline([["HGETALL", keys.snapshot_status],
                                          ["ZRANGE", keys.snapshot_replicas, 0, -1, "WITHSCORES"]])
    if not flat and not replicas:
        return None
    fields = {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
    report: dict[str, Any] = {
        "replicas": {r.decode(): {"last_beat_ms_ago": now - int(float(beat))}
                     for r, beat in zip(replicas[::2], replicas[1::2], strict=True)},
        "last_error": fields.get("last_error"),
        "last_error_ms_ago": now - int(fields["last_error_ms"]) if "last_error_ms" in fields
        else None,
        "last_commit_ms_ago": now - int(fields["last_commit_ms"]) if "last_commit_ms" in fields
        else None,
        "partitions": [await _partition(conn, keys, n, now) for n in range(keys.partitions)],
    }
    return report


async def _partition(conn: RedisConnection, keys: KeySpace, n: int, now: int) -> dict[str, Any]:
    part = keys.partition(n)
    holder, position, info = await conn.pipeline([
        ["GET", part.snapshot_lease],
        ["HMGET", part.snapshotted, "id", "n"],
        ["XINFO", "STREAM", part.events],
    ])
    stream = StreamInfo(info)
    report: dict[str, Any] = {"partition": n, "holder": holder.decode() if holder else None}
    if position[0] is None:
        report.update(position=None, lag_events=stream.length, lag_ms=None)
        return report
    lag = max(0, stream.added - int(position[1]))
    report.update(position=position[0].decode(), lag_events=lag, lag_ms=0)
    if lag:
        after = await conn.execute("XRANGE", part.events, "(" + position[0].decode(), "+",
                                   "COUNT", 1)
        if after:
            report["lag_ms"] = max(0, now - id_key(after[0][0])[0])
    return report
