"""What `stateworker status` shows of the snapshot: per partition its holder, the position
PostgreSQL acknowledged (mirrored in Redis) and the lag behind the stream in events and ms;
the snapshotters' last error (with its time; cleared once the snapshot works again), last
commit and replicas. Read from Redis only, so it shows while PostgreSQL is down (that is when
the lag matters)."""

from __future__ import annotations

from typing import Any

from stateworker.clock import now_ms, rfc3339_ms
from stateworker.keys import KeySpace
from stateworker.reactive.status import lag
from stateworker.reactive.trimming import StreamInfo
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
        # The last error and when it came; null again once the snapshot works again.
        "last_error": fields.get("last_error"),
        "last_error_at": rfc3339_ms(int(fields["last_error_ms"])) if "last_error_ms" in fields
        else None,
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
    report: dict[str, Any] = {"partition": n, "holder": holder.decode() if holder else None}
    report.update(await lag(conn, part.events, StreamInfo(info), position, now))
    return report
