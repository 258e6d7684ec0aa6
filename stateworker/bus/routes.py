"""Where a `StateClient` on a Redis Cluster sends each call and asks for its reply, so that the
call's own script can answer it (the fused path, lua/includes/answer.lua): the script writes
the reply only where its reply list is on the node of the call's state, and acknowledges the
call's entry where its stream is there too.

So a client keeps one reply list on each primary that holds a partition (`keys.reply_list_on`:
a slot of its own on that node, no partition's), and for a
call whose body names a scope it picks the list on the node of the scope's partition and,
with STATEWORKER_BUS_SHARDS > 1, a shard whose stream is on that node (else the documented
rule, `partition % shards`). The choice follows the client's map: after a failover or a
resharding it is made again from the new map. A call without a scope takes the first list
and the rule's shard. Any list and any shard are correct for any call (the service reads every
shard, answers on any list): the choice only decides whether the script can answer.
"""

from __future__ import annotations

from stateworker.bus.protocol import Shards
from stateworker.keys import KeySpace, reply_list_on
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import key_slot


class Routes:
    """One client's reply lists and, per partition, its (stream, reply list) on a cluster."""

    def __init__(self, conn: ClusterConnection, shards: Shards, reply_key: str, prefix: str,
                 partitions: int) -> None:
        self.conn = conn
        self.shards = shards
        keys = KeySpace(prefix, partitions)
        self._partition_slots = [key_slot(keys.partition(n).tag) for n in range(partitions)]
        nodes = sorted({node for slot in self._partition_slots
                        if (node := conn.owner(slot)) is not None})  # (by the map now)
        self.lists = [_list_on(conn, reply_key, node) for node in nodes] or [
            reply_list_on(reply_key, 0)]
        self._list_slots = [key_slot(name) for name in self.lists]
        self._stream_slots = [key_slot(stream) for stream in shards.streams]
        self._by_partition: list[tuple[str, str]] = []
        self._version = -1  # the map version _by_partition was made from

    def pick(self, partition: int | None, call_id: str) -> tuple[str, str]:
        """(the call's stream, its reply list)."""
        if partition is None:
            return self.shards.stream_at(None, call_id), self.lists[0]
        if self.conn.version != self._version:
            self._remap()
        return self._by_partition[partition]

    def _remap(self) -> None:
        owner = self.conn.owner
        list_on: dict[str | None, str] = {}  # a node -> its first list, its first shard
        for slot, name in zip(self._list_slots, self.lists, strict=True):
            list_on.setdefault(owner(slot), name)
        stream_on: dict[str | None, str] = {}
        streams = self.shards.streams
        for slot, stream in zip(self._stream_slots, streams, strict=True):
            stream_on.setdefault(owner(slot), stream)
        routes = []
        for n, slot in enumerate(self._partition_slots):
            node = owner(slot)
            routes.append((stream_on.get(node, streams[n % len(streams)]),
                           list_on.get(node, self.lists[0])))
        self._by_partition = routes
        self._version = self.conn.version


SEARCH = 10_000  # names tried for a node's reply list (a node serving a third: about 3)


def _list_on(conn: ClusterConnection, reply_key: str, node: str) -> str:
    """A reply list name whose slot `node` serves, by the map now (the first name tried when
    none is found: it is still a reply list, only not there)."""
    for n in range(SEARCH):
        name = reply_list_on(reply_key, n)
        if conn.owner(key_slot(name)) == node:
            return name
    return reply_list_on(reply_key, 0)
