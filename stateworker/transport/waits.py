"""`SlotWaits`: a blocking XREAD over streams of several slots of a Redis Cluster.

On one server, a reader that follows many streams (the dispatcher: the registry and each
partition it holds; an unscoped watch: every partition) waits for any of them with one
`XREAD BLOCK ... STREAMS a b c`. A cluster refuses that (CROSSSLOT, even for slots on one node:
one command, one slot), and one connection can hold only one blocked command. So here:
1. one XREAD without BLOCK per stream, all in one pipeline (the cluster connection sends one
   pipeline per primary, in the same tick): entries already there come back at once, which
   is every read under load;
2. only when none has anything, one `XREAD BLOCK` per stream, each on a connection of its own
   to the stream's primary (kept for the next wait), all at once; the first that answers
   ends the wait, and the others are cancelled: their connections are closed (a blocked
   XREAD stays blocked in Redis, a command after it would queue behind it) and opened again
   at the next wait. A MOVED or ASK ends the wait too (the map is read again; the caller's
   next read, routed by the cluster connection, follows the slot).
The reply has the XREAD's shape (`[[stream, entries], ...]`, None when nothing came).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection
from stateworker.transport.slots import key_slot
from stateworker.transport.wire import ConnectionLost, ReplyError

REDIRECTS = ("MOVED", "ASK")  # the slot is served elsewhere now: the wait is over


class SlotWaits:
    """Blocking reads of streams in several slots, for one reader (not shared: each stream's
    waiting connection holds one blocked command at a time)."""

    def __init__(self, conn: ClusterConnection) -> None:
        self.conn = conn  # routes the reads without BLOCK, and holds the map
        self._waiting: dict[str, RedisConnection] = {}  # stream -> its blocking connection

    async def xread(self, count: int, block_ms: int, streams: Sequence[str],
                    ids: Sequence[str]) -> list[Any] | None:
        """`XREAD COUNT count BLOCK block_ms STREAMS streams ids` as on one server: the
        entries after each id, of the streams that had some; None when nothing came within
        block_ms. Raises what the reads raise (ConnectionLost, an error reply)."""
        if len({key_slot(stream) for stream in streams}) == 1:  # one slot: one command
            reply: list[Any] | None = await self.conn.execute(
                "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", *streams, *ids)
            return reply
        replies = await self.conn.pipeline([["XREAD", "COUNT", count, "STREAMS", stream, after]
                                            for stream, after in zip(streams, ids, strict=True)])
        found = [item for reply in replies for item in _checked(reply) or []]
        if found:
            return found
        return await self._block(count, block_ms, streams, ids)

    async def _block(self, count: int, block_ms: int, streams: Sequence[str],
                     ids: Sequence[str]) -> list[Any] | None:
        found: list[Any] = []
        failed: list[BaseException] = []  # (raised as itself, not in an exception group)
        async with anyio.create_task_group() as tg:
            for stream, after in zip(streams, ids, strict=True):
                tg.start_soon(self._block_one, tg.cancel_scope, found, failed, count, block_ms,
                              stream, after)
        if failed:
            raise failed[0]
        return found or None

    async def _block_one(self, scope: anyio.CancelScope, found: list[Any],
                         failed: list[BaseException], count: int, block_ms: int, stream: str,
                         after: str) -> None:
        try:
            conn = await self._connection(stream)
            reply = await conn.execute("XREAD", "COUNT", count, "BLOCK", block_ms,
                                       "STREAMS", stream, after)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._drop(stream)
            raise
        except ReplyError as exc:
            await self._drop(stream)
            if str(exc).startswith(REDIRECTS):
                await self.conn.refresh()
            else:
                failed.append(exc)
            scope.cancel()
            return
        except ConnectionLost as exc:
            await self._drop(stream)
            failed.append(exc)
            scope.cancel()
            return
        if reply:
            found.extend(reply)
            scope.cancel()

    async def _connection(self, stream: str) -> RedisConnection:
        """The stream's waiting connection, to the primary serving it now."""
        conn = self._waiting.get(stream)
        if conn is not None:
            return conn
        slot = key_slot(stream)
        url = self.conn.owner_url(slot)
        if url is None:
            await self.conn.refresh()
            url = self.conn.owner_url(slot)
        if url is None:
            raise ConnectionLost(f"no primary of the Redis Cluster {self.conn.shown} serves "
                                 f"slot {slot} (stream {stream})")
        conn = self._waiting[stream] = RedisConnection(
            url, write_first_at_once=True, connect_timeout_s=self.conn.connect_timeout_s,
            read_timeout_s=self.conn.read_timeout_s)
        return conn

    async def _drop(self, stream: str) -> None:
        conn = self._waiting.pop(stream, None)
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        for stream in list(self._waiting):
            await self._drop(stream)


def _checked(reply: Any) -> Any:
    if isinstance(reply, ReplyError):
        raise reply
    return reply
