"""How a `ClusterConnection` (transport/cluster.py) routes commands: each to the primary of its
slot (slots.py: the slot of its keys; a keyless one to any primary; FUNCTION and SCRIPT to
every primary, so the function library is on each of them; an ACL change to every node). A
pipeline is split by node, one pipeline per node sent in the same tick (each node's connection
still writes once per tick), and the replies are handed back in the caller's order.

What the cluster answers, and what is done about it. Each of these replies means the command
did not run, so it is sent again:
- `MOVED slot host:port`: the slot has a new owner for good (a resharding, a failover). The
  map's entry is set to it, the whole map is read again (once per burst: callers that meet
  MOVED while a refresh runs wait for that one) and the command goes to the new owner.
- `ASK slot host:port`: the slot is being migrated and this key is already there: `ASKING`
  then the command on that node, once; the map is left as it is.
- `TRYAGAIN`, `CLUSTERDOWN`, and a primary that cannot be connected to (a failover under
  way): the map is read again after a backoff (retry.Backoff) until the cluster heals or
  `heal_within_s` has passed; then the last error is the caller's (plans make it UNAVAILABLE).
A connection lost while commands were in flight is raised as today (ConnectionLost): they may
have run, so they are not sent again here; the map is read again before the next command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from stateworker.transport.cluster_map import ClusterMap, Unplaced
from stateworker.transport.retry import Backoff
from stateworker.transport.slots import is_broadcast, is_for_every_node, pipeline_slots
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

log = logging.getLogger("stateworker.transport.cluster")

RETRIED = ("TRYAGAIN", "CLUSTERDOWN")  # cluster replies to a command that did not run
REROUTED = frozenset({"MOVED", "ASK", *RETRIED})  # ... and those that name where it goes


class ClusterRouting(ClusterMap):
    """The routing of a `ClusterConnection`: `_run` places, sends and sends again."""

    heal_within_s: float  # (ClusterConnection's: how long a command waits for a failover)
    _closed: bool

    async def _run(self, commands: Sequence[Sequence[Arg]], single: bool = False) -> list[Any]:
        if not self._primaries or self._stale:
            await self.refresh()
        results: list[Any] = [None] * len(commands)
        broadcast = [i for i, args in enumerate(commands) if is_broadcast(args)]
        for i in broadcast:
            results[i] = await self._broadcast(commands[i])
        todo = [i for i in range(len(commands)) if i not in broadcast] if broadcast \
            else list(range(len(commands)))
        near = pipeline_slots(commands)  # (CrossSlot raised here, before anything is sent)
        asking: dict[int, str] = {}
        backoff: Backoff | None = None  # (made on the first wait: most calls never wait)
        deadline = 0.0
        while todo:
            version = self._version
            groups: dict[str, list[int]] = {}
            unplaced: BaseException | None = None
            retry: list[int] = []
            for i in todo:
                try:
                    address = asking.get(i) or self._address(near[i])
                except Unplaced as exc:  # (the map has a hole: read it before the next call)
                    self._stale = True
                    unplaced, results[i] = exc.cause, exc.cause
                    retry.append(i)
                    continue
                groups.setdefault(address, []).append(i)
            replies = await self._send_groups(commands, groups, asking, single)
            moved = False
            for group, got in zip(groups.values(), replies, strict=True):
                if isinstance(got, Unplaced):  # its primary cannot be reached: not sent
                    unplaced = got.cause
                    for i in group:
                        results[i] = got.cause
                    retry.extend(group)
                    continue
                if isinstance(got, BaseException):  # lost in flight: they may have run
                    self._stale = True
                    raise got
                for i, reply in zip(group, got, strict=True):
                    asking.pop(i, None)
                    results[i] = reply
                    if not isinstance(reply, ReplyError):
                        continue
                    word, _, rest = str(reply).partition(" ")
                    if word == "MOVED":
                        slot, _, owner = rest.partition(" ")
                        self._owner[int(slot)] = owner
                        moved = True
                        retry.append(i)
                    elif word == "ASK":
                        asking[i] = rest.partition(" ")[2]
                        retry.append(i)
                    elif word in RETRIED:
                        unplaced = reply
                        retry.append(i)
            todo = sorted(retry)
            if not todo:
                break
            if unplaced is not None:  # a failover or a resharding under way: wait, then re-read
                if backoff is None:
                    backoff, deadline = Backoff(), time.monotonic() + self.heal_within_s
                delay = backoff.next()
                if time.monotonic() + delay >= deadline or self._closed:
                    if isinstance(unplaced, ConnectionLost):
                        raise unplaced
                    return results  # (the CLUSTERDOWN / TRYAGAIN replies stay the callers')
                log.info("the Redis Cluster is not serving every slot (%s): retrying", unplaced,
                         extra={"event": "cluster.retry", "redis": self.shown})
                await asyncio.sleep(delay)
                if not str(unplaced).startswith("TRYAGAIN"):  # (a migration: the map holds)
                    with contextlib.suppress(ConnectionLost):  # no seed now: the next wait
                        await self.refresh()
            elif moved and self._version == version:
                await self.refresh()
        return results

    async def _send_groups(self, commands: Sequence[Sequence[Arg]], groups: dict[str, list[int]],
                           asking: dict[int, str], single: bool) -> list[Any]:
        """Each node's commands as one pipeline, all in this tick; per node its replies or the
        exception it ended with. One node (the usual call): awaited directly, no task."""
        if len(groups) == 1:
            ((address, group),) = groups.items()
            try:
                return [await self._send_to(address, [commands[i] for i in group],
                                            [i in asking for i in group], single)]
            except (ConnectionLost, Unplaced) as exc:
                return [exc]
        sends: list[Awaitable[list[Any]]] = []
        for address, group in groups.items():
            chosen = [commands[i] for i in group]
            node = self._nodes.get(address)
            # (an open node with nothing redirected: its future, no task; else the coroutine)
            sent = None if single or node is None or any(i in asking for i in group) \
                else node.send_pipeline(chosen)
            sends.append(sent or self._send_to(address, chosen, [i in asking for i in group],
                                               single))
        replies: list[Any] = await asyncio.gather(*sends, return_exceptions=True)
        return replies

    async def _send_to(self, address: str, commands: list[Sequence[Arg]], asking: list[bool],
                    single: bool) -> list[Any]:
        """Commands to one node, ASKING before those redirected by ASK; their replies."""
        node = self._node(address)
        if not node.is_open:
            try:
                await node.connect()
            except ConnectionLost as exc:  # nothing was sent: safe to place again
                self._stale = True
                raise Unplaced(exc) from exc
        if single and not asking[0]:  # (execute: a blocking command's wait is allowed for)
            try:
                return [await node.execute(*commands[0])]
            except ReplyError as exc:
                return [exc]
        if not any(asking):
            return await node.pipeline(commands)
        sent: list[Sequence[Arg]] = []
        for args, ask in zip(commands, asking, strict=True):
            if ask:
                sent.append(["ASKING"])
            sent.append(args)
        replies = await node.pipeline(sent)
        out, position = [], 0
        for ask in asking:
            position += 1 if ask else 0
            out.append(replies[position])
            position += 1
        return out

    async def _broadcast(self, args: Sequence[Arg]) -> Any:
        """One command on every primary (an ACL change: every node, replicas too): the first
        error reply, else the first reply."""
        if not self._primaries:
            await self.refresh()
        addresses = [*self._primaries, *self._replicas] if is_for_every_node(args) \
            else self._primaries
        replies = await asyncio.gather(*(self._send_to(address, [args], [False], False)
                                         for address in addresses), return_exceptions=True)
        first: Any = None
        for got in replies:
            if isinstance(got, Unplaced):
                raise got.cause
            if isinstance(got, BaseException):
                raise got
            if isinstance(got[0], ReplyError):
                return got[0]
            first = got[0] if first is None else first
        return first
