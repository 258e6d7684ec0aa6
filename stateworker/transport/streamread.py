"""`StreamReader`: one blocking read of several streams (`XREAD` / `XREADGROUP … STREAMS s1 s2
… id1 id2 …`) whose streams may sit in different slots of a Redis Cluster.

On one server (or when every stream shares one slot) it is the one command, as before. On a
cluster one command cannot name two slots, so the read is split: one command per slot, each on
a connection of its own (a blocked read holds its connection), all sent at once. The first that
comes back with entries ends the wait of the others: `CLIENT UNBLOCK <id>` on their node makes
a blocked read return as if its time were up, which for XREADGROUP means nothing was delivered,
so no entry is left pending unseen. Every reply that came is merged, in the order the streams
were named.

Why not one read per slot in turn, or a short BLOCK each: a call on one shard would wait for
the other shards' BLOCK to run out (latency), or the idle reads would spin (CPU).

Under load most reads find entries waiting: so a split read first asks every slot without
BLOCK, one pipeline (one write per node, on the pipelined connections of `conn`), and blocks
only when none had any. A busy reader then never blocks nor unblocks (a CLIENT UNBLOCK and a
wait per read, which cost a service on a 3+3 cluster about a tenth of its CPU per call)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection
from stateworker.transport.slots import key_slot
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

UNBLOCK_RETRY_S = 0.005  # an UNBLOCK that came before the read blocked: sent again this soon


class _Lane:
    """The connection one slot's reads block on, and its CLIENT ID (to unblock it)."""

    def __init__(self, address: str, conn: RedisConnection) -> None:
        self.address = address
        self.conn = conn
        self.client_id: int | None = None


class StreamReader:
    """Blocking stream reads on `conn` (a connection of their own: they block it)."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self._lanes: dict[int, _Lane] = {}  # slot -> its lane (a cluster only)

    async def read(self, head: Sequence[Arg], streams: Sequence[str],
                   ids: Sequence[str]) -> list[Any] | None:
        """`*head STREAMS *streams *ids` (head: `XREAD COUNT n BLOCK ms` …): the reply, the
        streams that had entries with their entries, None when none had any."""
        conn = self.conn
        if not isinstance(conn, ClusterConnection):
            reply: list[Any] | None = await conn.execute(*head, "STREAMS", *streams, *ids)
            return reply
        groups: dict[int, list[int]] = {}
        for index, stream in enumerate(streams):
            groups.setdefault(key_slot(stream), []).append(index)
        if len(groups) == 1:
            reply = await conn.execute(*head, "STREAMS", *streams, *ids)
            return reply
        return await self._split(conn, head, streams, ids, groups)

    async def _split(self, conn: ClusterConnection, head: Sequence[Arg], streams: Sequence[str],
                     ids: Sequence[str], groups: dict[int, list[int]]) -> list[Any] | None:
        polled = await self._poll(conn, head, streams, ids, groups)
        if polled is not None:
            return polled
        tasks = {slot: asyncio.ensure_future(self._read_slot(
            conn, slot, [*head, "STREAMS", *(streams[i] for i in group),
                         *(ids[i] for i in group)])) for slot, group in groups.items()}
        try:
            pending = set(tasks.values())
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.exception() is not None or task.result() for task in done):
                    break  # entries (or an error): the others need not wait any longer
            await self._unblock(conn, {slot: task for slot, task in tasks.items()
                                       if not task.done()})
        finally:  # (cancelled: the reads still blocked are ended, their lanes dropped)
            if any(not task.done() for task in tasks.values()):
                for slot, task in tasks.items():
                    if not task.done():
                        task.cancel()
                        await self._drop(slot)
        found: list[Any] = []
        failure: BaseException | None = None
        for slot, task in tasks.items():
            error = task.exception()
            if error is not None:
                failure = failure or error
                await self._drop(slot)
            elif task.result():
                found.append(task.result())
        if failure is not None:  # (an XREADGROUP's entries read meanwhile stay pending)
            raise failure
        return _merged(found, streams)

    async def _poll(self, conn: ClusterConnection, head: Sequence[Arg], streams: Sequence[str],
                    ids: Sequence[str], groups: dict[int, list[int]]) -> list[Any] | None:
        """The read without BLOCK, every slot in one pipeline: what it found (merged), None
        when no stream had entries. Raises the first error reply (as a blocked read would)."""
        at = [i for i, arg in enumerate(head) if isinstance(arg, str) and arg.upper() == "BLOCK"]
        now = [arg for i, arg in enumerate(head) if not at or i not in (at[0], at[0] + 1)]
        replies = await conn.pipeline([[*now, "STREAMS", *(streams[i] for i in group),
                                        *(ids[i] for i in group)] for group in groups.values()])
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise reply
        return _merged([reply for reply in replies if reply], streams)

    async def _read_slot(self, conn: ClusterConnection, slot: int, args: list[Arg]) -> Any:
        try:
            lane = await self._lane(conn, slot)
            reply = await lane.conn.execute(*args)
        except ConnectionLost:  # (its primary gone: a failover; the map is read again)
            conn.mark_stale()
            raise
        except ReplyError as exc:
            word = str(exc).partition(" ")[0]
            if word in ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"):
                conn.mark_stale()  # (the map is read again before its next command)
            raise
        return reply

    async def _lane(self, conn: ClusterConnection, slot: int) -> _Lane:
        address = await conn.owner_of(slot)
        lane = self._lanes.get(slot)
        if lane is not None and lane.address != address:
            await self._drop(slot)
            lane = None
        if lane is None:
            lane = self._lanes[slot] = _Lane(address, RedisConnection(
                conn.node_url(address), connect_timeout_s=conn.connect_timeout_s,
                read_timeout_s=conn.read_timeout_s))
        if lane.client_id is None or not lane.conn.is_open:
            lane.client_id = int(await lane.conn.execute("CLIENT", "ID"))
        return lane

    async def _unblock(self, conn: ClusterConnection, blocked: dict[int, asyncio.Future[Any]]) -> None:
        """End the reads still blocked (each returns nothing) and wait for them."""
        for slot, task in blocked.items():
            while not task.done():  # (a read still connecting has no id yet: wait, again)
                lane = self._lanes.get(slot)
                if lane is not None and lane.client_id is not None:
                    with contextlib.suppress(ConnectionLost, ReplyError):
                        await conn.node(lane.address).execute("CLIENT", "UNBLOCK",
                                                              lane.client_id)
                await asyncio.wait([task], timeout=UNBLOCK_RETRY_S)

    async def _drop(self, slot: int) -> None:
        lane = self._lanes.pop(slot, None)
        if lane is not None:
            await lane.conn.close()

    async def close(self) -> None:
        for slot in list(self._lanes):
            await self._drop(slot)
        await self.conn.close()


def _merged(replies: list[Any], streams: Sequence[str]) -> list[Any] | None:
    """The streams of several replies that had entries, in the order `streams` names them;
    None when none had any."""
    merged = [item for reply in replies for item in reply]
    order = {stream: n for n, stream in enumerate(streams)}
    merged.sort(key=lambda item: order.get(_text(item[0]), 0))
    return merged or None


def _text(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)
