"""The process's time from Redis's clock (clock.anchor): read once when a connection opens,
then again every `every_s` for as long as the process serves.

Who reads it: the service from the state's Redis (state/lifecycle.py), where its scripts
run; a `Worker` and a `StateClient` from the Redis they call over (one server: the same).
So replicas, workers and callers on machines whose clocks disagree agree on the call
records' slices, expiry, leases and deadlines (docs/decisions/0004).
"""

from __future__ import annotations

import time

import anyio

from stateworker import clock
from stateworker.transport.connection import RedisConnection, url_user
from stateworker.transport.wire import ReplyError


async def sync_clock(conn: RedisConnection) -> bool:
    """Read Redis's `TIME` once (clock.anchor); False when Redis refused it (a user without
    TIME). A Redis away leaves the clock as it was (the next reading is the next chance)."""
    sent = time.monotonic_ns()
    try:
        reply = await conn.execute("TIME")
    except ReplyError:
        return False
    except OSError:  # (ConnectionLost and timeouts are OSErrors)
        return True
    clock.anchor(reply, sent, time.monotonic_ns())
    return True


async def follow_clock(conn: RedisConnection, every_s: float = clock.CLOCK_SYNC_S) -> None:
    """`sync_clock` every `every_s` until cancelled (a clock of this machine stepped, or its
    monotonic clock stood still while it slept, is followed within that), or until Redis
    refuses TIME."""
    while await sync_clock(conn):
        await anyio.sleep(every_s)


def may_read_clock(conn: RedisConnection) -> bool:
    """Whether a caller's or a worker's connection reads Redis's clock: not one whose URL
    names an ACL user (a principal's rule has no TIME, and each refusal is logged as one)."""
    return url_user(conn.url) is None
