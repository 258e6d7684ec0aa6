"""`ClusterConnection`: a Redis Cluster behind the interface of one `RedisConnection`.

It holds one lean pipelining `RedisConnection` per primary (never redis-py) and a map of the
16384 slots to the primary serving each, read with `CLUSTER SHARDS` from any seed that answers
(a URL may list several: `redis://h:7000,redis://h:7001`; a seed that is a replica serves the
map as well, one that is down is skipped; `answered` says which one did). Three classes, one
on the other: the map (`ClusterMap`, transport/cluster_map.py); the routing of each command to
the primary of its slot, following MOVED, ASK, TRYAGAIN and CLUSTERDOWN (`ClusterRouting`,
transport/cluster_routing.py); and here the connection's interface.

Why a subclass of RedisConnection: every place that holds a connection (plans, the library,
the registry, the bus ...) is typed with RedisConnection; a subclass that overrides every
public method passes through all of them unchanged, and the single-server path keeps its
code, with no indirection added per command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from stateworker.transport.cluster_map import Unplaced
from stateworker.transport.cluster_routing import REROUTED, ClusterRouting
from stateworker.transport.connection import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_READ_TIMEOUT_S
from stateworker.transport.slots import is_broadcast, slot_of
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

DEFAULT_HEAL_WITHIN_S = 30.0  # how long a command waits for a failover or a CLUSTERDOWN to end
# What a replica answers to WAIT / WAITAOF ("... cannot be used with replica instances"):
# the node the map has as a primary no longer is one.
_DEMOTED = "replica instances"


class ClusterConnection(ClusterRouting):
    """A Redis Cluster as one connection: `execute`, `pipeline` and `send_pipeline` route by
    slot; `url` is the seed list as given, `shown` the seeds without passwords."""

    def __init__(self, url: str, *, write_first_at_once: bool = True,
                 connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S,
                 read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
                 heal_within_s: float = DEFAULT_HEAL_WITHIN_S) -> None:
        super().__init__(url, write_first_at_once=write_first_at_once,
                         connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        self.heal_within_s = heal_within_s
        self._closed = False
        # The sends running as tasks (send_pipeline's, _send_direct's re-routed ones): held,
        # and cancelled by close(), so none lands (nor opens a connection) after it.
        self._rerouting: set[asyncio.Task[list[Any]]] = set()

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
            if isinstance(reply, ReplyError) and str(reply).partition(" ")[0] in REROUTED:
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

    # ---- every primary (WAIT, status, principal remove) -------------------------------------
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
            if isinstance(got, Unplaced):
                got = got.cause
            if isinstance(got, BaseException):
                self._stale = True
                raise got if isinstance(got, ConnectionLost) else ConnectionLost(str(got))
            if isinstance(got[0], ReplyError) and _DEMOTED in str(got[0]):
                self._stale = True
            out[address] = got[0]
        return out

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
                except Unplaced as exc:  # (a failover under way: the caller's error)
                    raise exc.cause from exc
                if isinstance(reply, ReplyError):
                    raise reply
                cursor, names = reply
                found += names
                if cursor in (b"0", "0"):
                    break
        return found
