"""A Redis Cluster's map, as `ClusterConnection` (transport/cluster.py) reads it: the seeds a
URL lists, `CLUSTER SHARDS` asked of the first seed (or known node) that answers, and its
reply as the slot -> primary table with the primaries and the online replicas.

A seed that is a replica serves the map as well as a primary; one that is down is skipped. A
primary whose health is `fail` owns no slot in the table (its replica is promoted, or the
slots stay unserved: CLUSTERDOWN until the cluster heals).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stateworker.transport.connection import RedisConnection, shown_url
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
