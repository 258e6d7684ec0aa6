"""A Redis Cluster's map, as `ClusterConnection` (transport/cluster.py) reads and holds it: the
seeds a URL lists, `CLUSTER SHARDS` asked of the first seed (or known node) that answers, and
its reply as the slot -> primary table with the primaries and the online replicas.

A seed that is a replica serves the map as well as a primary; one that is down is skipped. A
primary whose health is `fail` owns no slot in the table (its replica is promoted, or the
slots stay unserved: CLUSTERDOWN until the cluster heals).

`ClusterMap` is the map a `ClusterConnection` holds (its base class): the table, one
`RedisConnection` per node, the map read again (once per burst of callers that ask) and what
it answers (a slot's owner, the primaries, a node's URL and connection). Routing a command by
it: transport/cluster_routing.py.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterable
from typing import Any

from stateworker.transport.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    RedisConnection,
    shown_url,
)
from stateworker.transport.slots import SLOTS
from stateworker.transport.wire import ConnectionLost, ReplyError


def seeds_of(url: str) -> list[str]:
    """The seed URLs of a (comma-separated) URL."""
    return [part.strip() for part in url.split(",") if part.strip()]


def is_cluster_url(url: str) -> bool:
    """A URL that lists several seeds names a cluster (one URL is probed: lifecycle.py)."""
    return len(seeds_of(url)) > 1


async def read_shards(seeds: Iterable[str], shown: str, connect_timeout_s: float | None,
                      read_timeout_s: float | None) -> tuple[list[Any], str]:
    """`CLUSTER SHARDS` from the first of `seeds` (URLs) that answers, on a connection of its
    own, and that seed as shown (no password). ConnectionLost when none answers; `shown`
    names the cluster in its message."""
    last: BaseException | None = None
    for seed in seeds:
        probe = RedisConnection(seed, connect_timeout_s=connect_timeout_s,
                                read_timeout_s=read_timeout_s)
        try:
            shards = await probe.execute("CLUSTER", "SHARDS")
        except (ConnectionLost, ReplyError) as exc:
            last = exc
            continue
        finally:
            await probe.close()
        return shards, shown_url(seed)
    raise ConnectionLost(f"no seed of the Redis Cluster {shown} answered CLUSTER SHARDS: {last}")


def parse_shards(shards: list[Any]) -> tuple[list[str | None], list[str], list[str]]:
    """(slot -> its primary's `host:port` or None, the primaries, the online replicas) of a
    `CLUSTER SHARDS` reply (RESP2 or RESP3)."""
    owner: list[str | None] = [None] * SLOTS
    primaries: list[str] = []
    replicas: list[str] = []
    for shard in shards:
        fields = _pairs(shard)
        flat = fields.get(b"slots") or []
        for node in fields.get(b"nodes") or []:
            info = _pairs(node)
            host = (info.get(b"ip") or info.get(b"endpoint") or b"127.0.0.1").decode()
            address = f"{host}:{int(info[b'port'])}"
            if info.get(b"role") != b"master":
                if info.get(b"health") == b"online":  # (an ACL change reaches it too)
                    replicas.append(address)
                continue
            if info.get(b"health") == b"fail":
                continue
            primaries.append(address)
            for i in range(0, len(flat), 2):
                owner[int(flat[i]):int(flat[i + 1]) + 1] = \
                    [address] * (int(flat[i + 1]) - int(flat[i]) + 1)
    return owner, primaries, replicas


def _pairs(flat: Any) -> dict[bytes, Any]:
    """A RESP2 map (name, value, name, value ...) as a dict."""
    if isinstance(flat, dict):
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))


class Unplaced(Exception):
    """A command that could not be sent (no owner known, its primary unreachable)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class ClusterMap(RedisConnection):
    """The map of a Redis Cluster and a connection per node: the base of `ClusterConnection`
    (`url` is the seed list as given, `shown` the seeds without passwords)."""

    def __init__(self, url: str, *, write_first_at_once: bool = True,
                 connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S,
                 read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S) -> None:
        self.seeds = seeds_of(url)
        super().__init__(self.seeds[0], write_first_at_once=write_first_at_once,
                         connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        self.url = url
        self.shown = ",".join(shown_url(seed) for seed in self.seeds)
        self.answered: str | None = None  # the seed (shown) whose CLUSTER SHARDS built the map
        self.refreshes = 0  # maps read (tests count them: once per burst of MOVED)
        self._owner: list[str | None] = [None] * SLOTS  # slot -> "host:port" of its primary
        self._primaries: list[str] = []
        self._replicas: list[str] = []  # online replicas (ACL changes go to them too)
        self._nodes: dict[str, RedisConnection] = {}  # "host:port" -> its connection
        self._version = 0  # bumped by each map read
        self._refreshing: asyncio.Task[None] | None = None
        self._stale = False  # a connection broke: read the map before the next command
        self._closing: set[asyncio.Future[None]] = set()  # connections of dropped nodes

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
                raise Unplaced(ConnectionLost(f"no primary known in the Redis Cluster {self.shown}"))
            return self._primaries[0]
        address = self._owner[slot]
        if address is None:
            raise Unplaced(ReplyError(f"CLUSTERDOWN Hash slot {slot} not served"))
        return address

    @property
    def primaries(self) -> list[str]:
        """The primaries of the map (`host:port`), as last read."""
        return list(self._primaries)

    @property
    def connected(self) -> list[str]:
        """The nodes this connection holds a connection to (`host:port`)."""
        return list(self._nodes)

    async def owner_of(self, slot: int) -> str:
        """The primary (`host:port`) serving `slot`, the map read first when it is stale or
        has a hole; ConnectionLost when no seed answers, ReplyError (CLUSTERDOWN) when the
        slot has no owner."""
        if not self._primaries or self._stale or self._owner[slot] is None:
            await self.refresh()
        try:
            return self._address(slot)
        except Unplaced as exc:
            raise exc.cause from None

    def owner(self, slot: int) -> str | None:
        """The primary (`host:port`) serving `slot` as last mapped, the map not read (None:
        no owner known): which names share a node, for what may join them (the fused path)."""
        return self._owner[slot]

    def owner_url(self, slot: int) -> str | None:
        """The URL of the primary serving `slot` as last mapped (the first seed's scheme and
        credentials), None when the map has no owner for it: to group commands by node."""
        address = self._owner[slot]
        return None if address is None else self._node_url(address)

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
