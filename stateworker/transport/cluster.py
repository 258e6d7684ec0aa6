"""`ClusterConnection`: a Redis Cluster behind the interface of one `RedisConnection`.

It holds one lean pipelining `RedisConnection` per primary (never redis-py) and a map of the
16384 slots to the primary serving each, read with `CLUSTER SHARDS` from any seed that answers
(a URL may list several: `redis://h:7000,redis://h:7001`; a seed that is a replica serves the
map as well, one that is down is skipped; `answered` says which one did). Each command goes to
the primary of its slot (slots.py: the slot of its keys; a keyless one to any primary; FUNCTION
and SCRIPT to every primary, so the function library is on each of them). A pipeline is split
by node, one pipeline per node sent in the same tick (each node's connection still writes once
per tick), and the replies are handed back in the caller's order.

Why a subclass of RedisConnection: every place that holds a connection (plans, the library,
the registry, the bus ...) is typed with RedisConnection; a subclass that overrides every
public method passes through all of them unchanged, and the single-server path keeps its
code, with no indirection added per command.

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
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stateworker.transport.cluster_map import parse_shards, read_shards, seeds_of
from stateworker.transport.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    RedisConnection,
    shown_url,
)
from stateworker.transport.retry import Backoff
from stateworker.transport.slots import (
    SLOTS,
    is_broadcast,
    is_for_every_node,
    pipeline_slots,
    slot_of,
)
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

log = logging.getLogger("stateworker.transport.cluster")

DEFAULT_HEAL_WITHIN_S = 30.0  # how long a command waits for a failover or a CLUSTERDOWN to end
RETRIED = ("TRYAGAIN", "CLUSTERDOWN")  # cluster replies to a command that did not run
_REROUTED = frozenset({"MOVED", "ASK", *RETRIED})  # ... and those that name where it goes
# What a replica answers to WAIT / WAITAOF ("... cannot be used with replica instances"):
# the node the map has as a primary no longer is one.
_DEMOTED = "replica instances"


class _Unplaced(Exception):
    """A command that could not be sent (no owner known, its primary unreachable)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class ClusterConnection(RedisConnection):
    """A Redis Cluster as one connection: `execute`, `pipeline` and `send_pipeline` route by
    slot; `url` is the seed list as given, `shown` the seeds without passwords."""

    def __init__(self, url: str, *, write_first_at_once: bool = True,
                 connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S,
                 read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
                 heal_within_s: float = DEFAULT_HEAL_WITHIN_S) -> None:
        self.seeds = seeds_of(url)
        super().__init__(self.seeds[0], write_first_at_once=write_first_at_once,
                         connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        self.url = url
        self.shown = ",".join(shown_url(seed) for seed in self.seeds)
        self.heal_within_s = heal_within_s
        self.answered: str | None = None  # the seed (shown) whose CLUSTER SHARDS built the map
        self.refreshes = 0  # maps read (tests count them: once per burst of MOVED)
        self._owner: list[str | None] = [None] * SLOTS  # slot -> "host:port" of its primary
        self._primaries: list[str] = []
        self._replicas: list[str] = []  # online replicas (ACL changes go to them too)
        self._nodes: dict[str, RedisConnection] = {}  # "host:port" -> its connection
        self._version = 0  # bumped by each map read
        self._refreshing: asyncio.Task[None] | None = None
        self._stale = False  # a connection broke: read the map before the next command
        self._closed = False
        self._closing: set[asyncio.Future[None]] = set()  # connections of dropped nodes
        # The sends running as tasks (send_pipeline's, _send_direct's re-routed ones): held,
        # and cancelled by close(), so none lands (nor opens a connection) after it.
        self._rerouting: set[asyncio.Task[list[Any]]] = set()

    # ---- the map -------------------------------------------------------------------------------
    def _node(self, address: str) -> RedisConnection:
        node = self._nodes.get(address)
        if node is None:
            node = RedisConnection(self._node_url(address), write_first_at_once=self.write_first_at_once,
                                   connect_timeout_s=self.connect_timeout_s,
                                   read_timeout_s=self.read_timeout_s)
            self._nodes[address] = node
        return node

    def _node_url(self, address: str) -> str:
        """A node's URL: the first seed's scheme and credentials, the node's host and port."""
        parts = urllib.parse.urlsplit(self.seeds[0])
        userinfo, at, _ = parts.netloc.rpartition("@")
        return urllib.parse.urlunsplit(("redis", f"{userinfo}{at}{address}", "", "", ""))

    async def refresh(self) -> None:
        """Read the map again; callers that ask while a read runs wait for that one."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.ensure_future(self._read_map())
        await asyncio.shield(task)

    async def _read_map(self) -> None:
        shards, answered = await read_shards(
            [*self.seeds, *(node.url for node in self._nodes.values())], self.shown,
            self.connect_timeout_s, self.read_timeout_s)
        owner, primaries, replicas = parse_shards(shards)
        for address in list(self._nodes):  # a node gone after a failover: dropped
            if address not in primaries and address not in replicas:
                node = self._nodes.pop(address)
                closing = asyncio.ensure_future(node.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        self._owner, self._primaries, self._replicas = owner, primaries, replicas
        self.answered = answered
        self._version += 1
        self.refreshes += 1
        self._stale = False

    def _address(self, slot: int | None) -> str:
        """The primary serving `slot` (None: a keyless command, any primary)."""
        if slot is None:
            if not self._primaries:
                raise _Unplaced(ConnectionLost(f"no primary known in the Redis Cluster {self.shown}"))
            return self._primaries[0]
        address = self._owner[slot]
        if address is None:
            raise _Unplaced(ReplyError(f"CLUSTERDOWN Hash slot {slot} not served"))
        return address

    @property
    def primaries(self) -> list[str]:
        """The primaries of the map (`host:port`), as last read."""
        return list(self._primaries)

    @property
    def connected(self) -> list[str]:
        """The nodes this connection holds a connection to (`host:port`)."""
        return list(self._nodes)

    # ---- the connection's interface ------------------------------------------------------------
    async def connect(self) -> None:
        """Read the map (ConnectionLost when no seed answers) and connect to every primary."""
        await self.refresh()
        for address in list(self._primaries):
            await self._node(address).connect()

    async def try_connect(self) -> bool:
        try:
            await self.connect()
        except ConnectionLost:
            return False
        return True

    async def execute(self, *args: Arg) -> Any:
        """One command to the primary of its slot; its error reply raised."""
        (reply,) = await self._run([args], single=True)
        if isinstance(reply, ReplyError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Commands split by primary, one pipeline each; replies in the caller's order."""
        if not commands:
            return []
        if len(commands) == 1 and not self._stale:
            direct = self._send_direct(commands[0])
            if direct is not None:
                return await direct
        return await self._run(commands)

    def send_pipeline(self, commands: Sequence[Sequence[Arg]]) -> asyncio.Future[list[Any]] | None:
        """`pipeline` as a future (None before the map is read: use `pipeline`)."""
        if not self._primaries or self._stale:
            return None
        if len(commands) == 1:
            direct = self._send_direct(commands[0])
            if direct is not None:
                return direct
        task = asyncio.ensure_future(self._run(commands))
        self._rerouting.add(task)
        task.add_done_callback(self._rerouting.discard)
        return task

    def _send_direct(self, args: Sequence[Arg]) -> asyncio.Future[list[Any]] | None:
        """One keyed command put on the wire to its slot's primary in this tick, with no task
        (a client's XADD: most calls are this); None when it needs `_run` (no key, every
        primary, no open connection to its node). A reply that says it did not run (MOVED,
        ASK, TRYAGAIN, CLUSTERDOWN) hands it to `_run`, which follows the cluster; a lost
        connection marks the map stale, as `_run` does."""
        if is_broadcast(args):
            return None
        slot = slot_of(args)
        address = None if slot is None else self._owner[slot]
        node = None if address is None else self._nodes.get(address)
        sent = None if node is None else node.send_pipeline([args])
        if sent is None:
            return None
        out: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()

        def landed(done: asyncio.Future[list[Any]]) -> None:
            failed = None if done.cancelled() else done.exception()  # (read: never "unretrieved")
            if out.done():  # (its caller went away)
                return
            if done.cancelled() or failed is not None:
                self._stale = True
                out.set_exception(failed or ConnectionLost("the command was cancelled"))
                return
            reply = done.result()[0]
            if isinstance(reply, ReplyError) and str(reply).partition(" ")[0] in _REROUTED:
                again = asyncio.ensure_future(self._run([args]))
                self._rerouting.add(again)
                again.add_done_callback(self._rerouted(out))
                return
            out.set_result([reply])

        sent.add_done_callback(landed)
        return out

    def _rerouted(self, out: asyncio.Future[list[Any]]) -> Callable[[asyncio.Task[list[Any]]], None]:
        """What hands a re-routed command's outcome (`_send_direct`) to its caller's future."""
        def done(task: asyncio.Task[list[Any]]) -> None:
            self._rerouting.discard(task)
            if out.done():
                return
            if task.cancelled():
                out.cancel()
            elif task.exception() is not None:
                out.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                out.set_result(task.result())
        return done

    async def close(self) -> None:
        self._closed = True
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        sending = list(self._rerouting)
        for task in sending:
            task.cancel()
        if sending:
            await asyncio.gather(*sending, return_exceptions=True)
        nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            await node.close()

    async def owner_of(self, slot: int) -> str:
        """The primary (`host:port`) serving `slot`, the map read first when it is stale or
        has a hole; ConnectionLost when no seed answers, ReplyError (CLUSTERDOWN) when the
        slot has no owner."""
        if not self._primaries or self._stale or self._owner[slot] is None:
            await self.refresh()
        try:
            return self._address(slot)
        except _Unplaced as exc:
            raise exc.cause from None

    def owner(self, slot: int) -> str | None:
        """The primary (`host:port`) serving `slot` as last mapped, the map not read (None:
        no owner known): which names share a node, for what may join them (the fused path)."""
        return self._owner[slot]

    @property
    def version(self) -> int:
        """Bumped by each map read: what was derived from `owner` holds while it is the same."""
        return self._version

    def node(self, address: str) -> RedisConnection:
        """The connection to one node (`host:port`), for what must go to that node alone."""
        return self._node(address)

    def node_url(self, address: str) -> str:
        """A node's URL (the seeds' credentials), for a connection of one's own to it."""
        return self._node_url(address)

    def mark_stale(self) -> None:
        """The map is read again before the next command (a reply said it moved)."""
        self._stale = True

    async def on_every_primary(self, *args: Arg) -> dict[str, Any]:
        """One keyless command on each primary of the map, sent at once (e.g. WAIT: each
        connection's own writes; a primary still without slots may hold writes sent to it with
        ASK): `host:port` -> its reply, an error reply
        as a ReplyError. A node that answers as a replica (a primary demoted by a failover
        that no routed command has told the map of yet) marks the map stale, so the next call
        reads it again. Raises ConnectionLost when a primary cannot be reached or its
        connection breaks."""
        if not self._primaries or self._stale:
            await self.refresh()
        addresses = list(self._primaries)
        replies = await asyncio.gather(*(self._send_to(address, [args], [False], False)
                                         for address in addresses), return_exceptions=True)
        out: dict[str, Any] = {}
        for address, got in zip(addresses, replies, strict=True):
            if isinstance(got, _Unplaced):
                got = got.cause
            if isinstance(got, BaseException):
                self._stale = True
                raise got if isinstance(got, ConnectionLost) else ConnectionLost(str(got))
            if isinstance(got[0], ReplyError) and _DEMOTED in str(got[0]):
                self._stale = True
            out[address] = got[0]
        return out

    # ---- routing -------------------------------------------------------------------------------
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
                except _Unplaced as exc:  # (the map has a hole: read it before the next call)
                    self._stale = True
                    unplaced, results[i] = exc.cause, exc.cause
                    retry.append(i)
                    continue
                groups.setdefault(address, []).append(i)
            replies = await self._send_groups(commands, groups, asking, single)
            moved = False
            for group, got in zip(groups.values(), replies, strict=True):
                if isinstance(got, _Unplaced):  # its primary cannot be reached: not sent
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
            except (ConnectionLost, _Unplaced) as exc:
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
                raise _Unplaced(exc) from exc
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
            if isinstance(got, _Unplaced):
                raise got.cause
            if isinstance(got, BaseException):
                raise got
            if isinstance(got[0], ReplyError):
                return got[0]
            first = got[0] if first is None else first
        return first

    # ---- every primary (status, principal remove) --------------------------------------------
    async def scan_every_primary(self, *args: Arg) -> list[bytes]:
        """The names `SCAN <cursor> *args` (MATCH / TYPE / COUNT ...) finds on every primary,
        each walked to the end of its own cursor: a keyless SCAN goes to one primary, which
        holds only its own slots' keys (a key in a slot being migrated may be found twice).
        A pattern with a hash tag is one slot's: send that with `execute`, which routes it."""
        if not self._primaries or self._stale:
            await self.refresh()
        found: list[bytes] = []
        for address in list(self._primaries):
            cursor: Any = b"0"
            while True:
                try:
                    (reply,) = await self._send_to(address, [["SCAN", cursor, *args]], [False],
                                                   True)
                except _Unplaced as exc:  # (a failover under way: the caller's error)
                    raise exc.cause from exc
                if isinstance(reply, ReplyError):
                    raise reply
                cursor, names = reply
                found += names
                if cursor in (b"0", "0"):
                    break
        return found

    def owner_url(self, slot: int) -> str | None:
        """The URL of the primary serving `slot` as last mapped (the first seed's scheme and
        credentials), None when the map has no owner for it: to group commands by node."""
        address = self._owner[slot]
        return None if address is None else self._node_url(address)
