"""Riding out a Redis that cannot serve for a while: which errors are worth a retry
(`transient_reason`), how long to wait between tries (`Backoff`), and waiting until a Redis
answers (`wait_ready`, `open_ready`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from stateworker.errors import ConfigError, Unavailable
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.wire import ConnectionLost, ReplyError

# The error replies of a Redis that cannot serve for a while: loading its dataset after a
# restart, running a script past its time limit, a cluster resharding or down, a replica cut
# off from its master. The command did not run, and the same command may succeed later.
TRANSIENT_REPLIES = frozenset({"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN"})

# What a caller told there is no Redis (StateClient, Worker, the CLI) can do about it.
HOW_TO_START = ("Start it with ./scripts/run, or set STATEWORKER_REDIS_URL (--redis-url) to "
                "the Redis it uses")


def no_redis_text(url: str, reason: object) -> str:
    """One line for a Redis that cannot be reached: where, why, and how to get one."""
    return f"no Redis at {shown_url(url)} ({reason}): is the service running? {HOW_TO_START}"


def transient_reason(error: BaseException | None) -> str | None:
    """Why `error` is worth a retry: the error reply's first word (`LOADING`, `BUSY` ...) or
    `CONNECTION` (refused, broken, timed out); None when it is not transient (a retry would
    meet it again). `BUSYGROUP` and `BUSYKEY` are not `BUSY`: only the whole word counts."""
    if isinstance(error, ConnectionLost):
        return "CONNECTION"
    if isinstance(error, ReplyError):
        word = str(error).split(" ", 1)[0]
        return word if word in TRANSIENT_REPLIES else None
    return None



def refused_for_now(reply: object) -> bool:
    """Whether Redis refused a write it may take later: a transient state (`transient_reason`)
    or out of memory (`OOM`, at its maxmemory: it takes writes again once memory is freed).
    What such a refusal stood for must stay to be done again (a reply unacknowledged, a
    trigger's position held back), unlike a refusal for good (WRONGTYPE, NOPERM)."""
    return isinstance(reply, ReplyError) and (
        str(reply).startswith("OOM") or transient_reason(reply) is not None)

class Backoff:
    """Bounded, jittered exponential backoff: `first_s` (50 ms) doubling up to `max_s` (1 s);
    each wait is drawn from [d/2, d], so callers that failed together do not all come back in
    the same tick. `failures` counts the waits since the last `reset()`."""

    __slots__ = ("_next_s", "failures", "first_s", "max_s")

    def __init__(self, first_s: float = 0.05, max_s: float = 1.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._next_s = first_s
        self.failures = 0

    def next(self) -> float:
        """The next wait in seconds (and the one after it doubles)."""
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._next_s = self.first_s
        self.failures = 0


async def wait_ready(conn: RedisConnection, within_s: float | None,
                     waiting: Callable[[BaseException], None] | None = None) -> None:
    """PING until Redis answers. A transient state (`transient_reason`: refused or lost
    connections, LOADING, BUSY ...) is retried with `Backoff`, telling `waiting(error)` each
    time; once `within_s` seconds have passed (None: never) its last error is raised. Any
    other error is raised at once."""
    end = None if within_s is None else time.monotonic() + within_s
    backoff = Backoff()
    while True:
        try:
            if end is None:
                await conn.execute("PING")
            else:
                async with asyncio.timeout(max(end - time.monotonic(), 0.001)):
                    await conn.execute("PING")
            return
        except TimeoutError:  # the bound, not Redis: a connect or reply that hangs
            raise ConnectionLost(f"no answer from Redis at {conn.shown} within {within_s:g} s") \
                from None
        except (ConnectionLost, ReplyError) as exc:
            if transient_reason(exc) is None:
                raise
            if waiting is not None:
                waiting(exc)
            delay = backoff.next()
            if end is not None and time.monotonic() + delay >= end:
                raise
            await asyncio.sleep(delay)


async def ping_trouble(conn: RedisConnection, what: str = "Redis",
                       within_s: float = 1.0) -> str | None:
    """None when Redis on `conn` answers a PING within `within_s`; else why not, naming
    `what` and its address (readiness, /metrics)."""
    try:
        async with asyncio.timeout(within_s):
            await conn.execute("PING")
    except TimeoutError:
        return f"{what} at {conn.shown} did not answer a PING within {within_s:g} s"
    except (ConnectionLost, ReplyError) as exc:
        return f"{what} at {conn.shown}: {exc}"
    return None


async def open_ready(conn: RedisConnection, within_s: float,
                     waiting: Callable[[BaseException], None] | None, who: str) -> None:
    """`wait_ready` for something that opens on a Redis (a client, a watch): no Redis within
    `within_s` is Unavailable naming the URL and how to start the service, a transient state
    that lasted is Unavailable, a refusal for good (NOAUTH ...) is ConfigError."""
    try:
        await wait_ready(conn, within_s, waiting)
    except ConnectionLost as exc:
        raise Unavailable(no_redis_text(conn.url, exc), {"redis": conn.shown}) from exc
    except ReplyError as exc:
        if transient_reason(exc) is None:
            raise ConfigError(f"Redis at {conn.shown} refused {who}: {exc}") from exc
        raise Unavailable(f"Redis at {conn.shown} is not serving yet after {within_s:g} s: "
                          f"{exc}", {"redis": conn.shown}) from exc
