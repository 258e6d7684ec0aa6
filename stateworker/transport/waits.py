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
   ends the wait, and the others are ended with `CLIENT UNBLOCK` (one pipeline per primary,
   on a connection of its own): their connections stay open for the next wait. One that
   cannot be unblocked so (Redis had not blocked it yet) is cancelled and its connection
   closed (a blocked XREAD stays blocked in Redis: a command after it would queue behind
   it). A MOVED or ASK ends the wait too (the map is read again; the caller's next read,
   routed by the cluster connection, follows the slot).
The reply has the XREAD's shape (`[[stream, entries], ...]`, None when nothing came).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection
from stateworker.transport.slots import key_slot
from stateworker.transport.wire import ConnectionLost, ReplyError

REDIRECTS = ("MOVED", "ASK")  # the slot is served elsewhere now: the wait is over


@dataclass(frozen=True, slots=True)
class _Waiter:
    """One stream's blocking connection."""

    conn: RedisConnection
    node: str  # the URL of the primary it is connected to
    client_id: int  # its CLIENT ID there


class SlotWaits:
    """Blocking reads of streams in several slots, for one reader (not shared: each stream's
    waiting connection holds one blocked command at a time)."""

    def __init__(self, conn: ClusterConnection) -> None:
        self.conn = conn  # routes the reads without BLOCK, and holds the map
        self._waiting: dict[str, _Waiter] = {}  # stream -> its blocking connection
        self._control: dict[str, RedisConnection] = {}  # node URL -> where UNBLOCK is sent

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
        blocked: dict[str, anyio.CancelScope] = {}  # streams still waiting -> their task's
        over = anyio.Event()  # one answered or failed, or every wait ran out
        async with anyio.create_task_group() as tg:
            for stream, after in zip(streams, ids, strict=True):
                blocked[stream] = anyio.CancelScope()
                tg.start_soon(self._block_one, blocked, over, found, failed, count, block_ms,
                              stream, after)
            await over.wait()
            await self._unblock(blocked)
        if failed:
            raise failed[0]
        return found or None

    async def _block_one(self, blocked: dict[str, anyio.CancelScope], over: anyio.Event,
                         found: list[Any], failed: list[BaseException], count: int,
                         block_ms: int, stream: str, after: str) -> None:
        reply: list[Any] | None = None  # (stays None when its own scope cancels it)
        with blocked[stream]:
            try:
                waiter = await self._waiter(stream)
                reply = await waiter.conn.execute("XREAD", "COUNT", count, "BLOCK", block_ms,
                                                  "STREAMS", stream, after)
            except anyio.get_cancelled_exc_class():
                # Its XREAD stays blocked in Redis: a command after it would queue behind it.
                with anyio.CancelScope(shield=True):
                    await self._drop(stream)
                raise
            except ReplyError as exc:
                await self._drop(stream)
                if str(exc).startswith(REDIRECTS):
                    await self.conn.refresh()
                else:
                    failed.append(exc)
                reply = None
                over.set()
            except ConnectionLost as exc:
                await self._drop(stream)
                failed.append(exc)
                reply = None
                over.set()
        del blocked[stream]
        if reply:
            found.extend(reply)
            over.set()
        if not blocked:
            over.set()

    async def _unblock(self, blocked: dict[str, anyio.CancelScope]) -> None:
        """End the waits still blocked: `CLIENT UNBLOCK` on their primaries (their XREAD
        answers nil, their connections stay open for the next wait). One whose XREAD Redis
        had not blocked yet (the unblock came first: reply 0), still connecting, or that
        cannot be unblocked, is cancelled (its connection closed)."""
        by_node: dict[str, list[tuple[str, _Waiter]]] = {}
        for stream in list(blocked):
            waiter = self._waiting.get(stream)
            if waiter is None:  # still connecting
                blocked[stream].cancel()
            else:
                by_node.setdefault(waiter.node, []).append((stream, waiter))
        for node, waiting in by_node.items():
            control = self._control.get(node)
            if control is None:
                control = self._control[node] = self._connection(node)
            try:
                replies = await control.pipeline(
                    [["CLIENT", "UNBLOCK", waiter.client_id] for _, waiter in waiting])
            except ConnectionLost:
                replies = [0] * len(waiting)
            for (stream, _), reply in zip(waiting, replies, strict=True):
                if reply != 1 and stream in blocked:
                    blocked[stream].cancel()

    async def _waiter(self, stream: str) -> _Waiter:
        """The stream's waiting connection, to the primary serving it now."""
        waiter = self._waiting.get(stream)
        if waiter is not None:
            return waiter
        slot = key_slot(stream)
        url = self.conn.owner_url(slot)
        if url is None:
            await self.conn.refresh()
            url = self.conn.owner_url(slot)
        if url is None:
            raise ConnectionLost(f"no primary of the Redis Cluster {self.conn.shown} serves "
                                 f"slot {slot} (stream {stream})")
        conn = self._connection(url)
        try:
            client_id = int(await conn.execute("CLIENT", "ID"))  # (what CLIENT UNBLOCK names)
        except BaseException:  # (cancelled too: the connection is nobody's)
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        waiter = self._waiting[stream] = _Waiter(conn, url, client_id)
        return waiter

    def _connection(self, url: str) -> RedisConnection:
        return RedisConnection(url, write_first_at_once=True,
                               connect_timeout_s=self.conn.connect_timeout_s,
                               read_timeout_s=self.conn.read_timeout_s)

    async def _drop(self, stream: str) -> None:
        waiter = self._waiting.pop(stream, None)
        if waiter is not None:
            await waiter.conn.close()

    async def close(self) -> None:
        for stream in list(self._waiting):
            await self._drop(stream)
        controls, self._control = list(self._control.values()), {}
        for control in controls:
            await control.close()


def _checked(reply: Any) -> Any:
    if isinstance(reply, ReplyError):
        raise reply
    return reply
