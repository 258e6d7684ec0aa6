"""Which replica dispatches which partition: leases in Redis, shared out evenly.

Every replica beats its heartbeat into `keys.replicas` (a zset scored by time) and counts the
live ones (a beat within three lease times); its share is ceil(partitions / live). It renews
what it holds, takes free partitions up to its share, and gives back what is over it (at a
batch boundary: the dispatcher asks `excess()` between batches, so a partition is never
given away with a batch half handed on). A replica that dies stops renewing; its leases
expire after `lease_ms` and the others take them in their next round.

The snapshotter (snapshot/) shares its partitions the same way with leases of its own
(`Leases(..., lease_of=..., replicas=...)`): its own lease key and replica set.

Each partition has one lease (`lua/lease.lua`: take, renew, drop, all only with the holder's
token); the dispatch position moves only while the lease holds (`lua/advance.lua`), so a
replica that lost a lease (paused, cut off) cannot move the position of its successor.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Callable
from typing import Any

from stateworker.clock import now_ms
from stateworker.keys import PartitionKeys
from stateworker.logs import repeats
from stateworker.scripts.upkeep_bindings import LEASE, lease_call
from stateworker.settings import LIVE_LEASES
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ReplyError

log = logging.getLogger("stateworker.reactive.leases")


class Leases:
    """One replica's leases."""

    def __init__(self, state: RedisState, token: str,
                 lease_of: Callable[[PartitionKeys], str] = lambda keys: keys.lease,
                 replicas: str | None = None) -> None:
        self.state = state
        self.token = token  # the replica id: the lease holder's name in `status`
        self.lease_of = lease_of  # which lease key of a partition (dispatch or snapshot)
        self.replicas = replicas or state.keys.replicas  # the zset this kind of replica beats in
        self.lease_ms = state.settings.lease_ms
        # A holder renews five times per lease (settings.lease_ms), so a round that comes
        # late or fails once still renews in time.
        self.renew_s = self.lease_ms / 5000
        self.held: set[int] = set()
        # Where this replica starts looking for free partitions: replicas starting at once
        # do not all race for partition 0.
        self._start = zlib.crc32(token.encode()) % state.settings.partitions
        self.share = state.settings.partitions

    def _lease(self, op: str, partition: int) -> list[Any]:
        key = self.lease_of(self.state.keys.partition(partition))
        return LEASE.command(self.state.library, *lease_call(key, op, self.token, self.lease_ms))

    async def _run(self, op: str, partitions: list[int]) -> list[bool]:
        if not partitions:
            return []
        replies = await pipeline(self.state.conn, self.state.library,
                                 [self._lease(op, p) for p in partitions])
        return [LEASE.read(reply).done for reply in replies]

    async def beat(self) -> None:
        """Heartbeat, count the live replicas, compute the share."""
        now = now_ms()
        replies = await self.state.conn.pipeline([
            ["ZADD", self.replicas, now, self.token],
            ["ZREMRANGEBYSCORE", self.replicas, "-inf", now - LIVE_LEASES * self.lease_ms],
            ["ZCARD", self.replicas],
        ])
        failed = next((r for r in replies if isinstance(r, ReplyError)), None)
        if failed is not None:  # (LOADING after a restart ...: the dispatcher pauses)
            raise failed
        live = max(1, int(replies[2]))
        self.share = math.ceil(self.state.settings.partitions / live)

    async def round(self) -> set[int]:
        """Beat, renew, take up to the share; the partitions newly taken."""
        await self.beat()
        held = sorted(self.held)
        lost = [p for p, kept in zip(held, await self._run("renew", held), strict=True)
                if not kept]
        if lost:  # (said once a window: a busy or full Redis makes every lease lapse at once)
            self.held.difference_update(lost)
            repeats.log(log, logging.WARNING, "lost the lease of partitions %s", lost,
                        extra={"event": "dispatch.lease_lost", "partitions": lost})
        taken: set[int] = set()
        want = self.share - len(self.held)
        if want > 0:
            count = self.state.settings.partitions
            free = [(self._start + i) % count for i in range(count)]
            free = [p for p in free if p not in self.held]
            for partition, won in zip(free, await self._run("take", free), strict=True):
                if won and want > 0:
                    self.held.add(partition)
                    taken.add(partition)
                    want -= 1
                elif won:  # took more than the share in one go: give it back at once
                    await self._run("drop", [partition])
        return taken

    def excess(self) -> list[int]:
        """Partitions held beyond the share: the dispatcher gives them back between batches."""
        over = len(self.held) - self.share
        return sorted(self.held, reverse=True)[:over] if over > 0 else []

    async def drop(self, partitions: list[int]) -> None:
        await self._run("drop", partitions)
        self.held.difference_update(partitions)

    async def drop_all(self) -> None:
        await self.drop(sorted(self.held))
        await self.state.conn.execute("ZREM", self.replicas, self.token)
