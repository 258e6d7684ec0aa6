"""What a `strict` batch waits for before any of its replies goes out: the AOF fsync (Redis
fsyncs before it replies with `appendfsync always`; where the server has WAITAOF, 7.2+, that is
confirmed as well) and, when `replicas` > 0, that many replicas holding the batch, so a
failover that promotes one of them loses no acknowledged write.

How: one command per primary after the batch, on the same connection that sent the batch
(both WAIT and WAITAOF cover the writes of the connection they are sent on): `WAITAOF 1 n t`
where the server has it, else `WAIT n t`. On a Redis Cluster it goes to every primary
(ClusterConnection.on_every_primary): a batch may have written to any of them, and a primary
this connection wrote nothing to since answers at once."""

from __future__ import annotations

from typing import Any

from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost, ReplyError

# With appendfsync always the fsync is already done and a replica on the same network acks
# within a few milliseconds; this long without the acks, the batch's callers get UNAVAILABLE.
CONFIRM_TIMEOUT_MS = 2000


class Confirm:
    """How a strict batch is confirmed (decided at start by lifecycle.check_strict)."""

    def __init__(self, *, waitaof: bool = False, replicas: int = 0) -> None:
        self.waitaof = waitaof  # the server has WAITAOF (7.2+)
        self.replicas = replicas  # replicas that must hold a batch (STATEWORKER_STRICT_REPLICAS)

    @property
    def needed(self) -> bool:
        """Whether a batch waits for anything beyond Redis's own reply."""
        return self.waitaof or self.replicas > 0

    def describe(self) -> str:
        """What the start line says makes a strict reply wait."""
        parts = ["appendfsync always"]
        if self.waitaof:
            parts.append(f"WAITAOF 1 {self.replicas}")
        elif self.replicas:
            parts.append(f"WAIT {self.replicas}")
        return " + ".join(parts)

    def command(self) -> list[Any]:
        if self.waitaof:
            return ["WAITAOF", 1, self.replicas, CONFIRM_TIMEOUT_MS]
        return ["WAIT", self.replicas, CONFIRM_TIMEOUT_MS]

    async def missing(self, conn: RedisConnection) -> str | None:
        """None once every primary confirmed the writes sent so far; else what is missing
        (for the UNAVAILABLE the batch's callers get)."""
        try:
            if isinstance(conn, ClusterConnection):
                replies = await conn.on_every_primary(*self.command())
            else:
                replies = {conn.shown: await conn.execute(*self.command())}
        except (ReplyError, ConnectionLost) as exc:  # AOF turned off, a primary gone
            return (f"Redis at {conn.shown} did not confirm the write (durability strict, "
                    f"{self.describe()}): {exc}")
        short = [f"{node}: {self._shortfall(reply)}" for node, reply in replies.items()
                 if self._shortfall(reply)]
        if not short:
            return None
        return (f"not confirmed within {CONFIRM_TIMEOUT_MS} ms (durability strict, "
                f"{self.describe()}): {'; '.join(short)}")

    def _shortfall(self, reply: Any) -> str:
        """'' when `reply` confirms the batch; else what fell short."""
        if isinstance(reply, ReplyError):
            return str(reply)
        if self.waitaof:
            numlocal, numreplicas = reply
            if numlocal < 1:
                return "the AOF fsync (is AOF still on?)"
        else:
            numreplicas = reply
        if numreplicas < self.replicas:
            return f"{numreplicas} of {self.replicas} replicas (STATEWORKER_STRICT_REPLICAS)"
        return ""
