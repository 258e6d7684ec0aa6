"""One place that turns a Redis URL into a connection: one server (`RedisConnection`) or a
Redis Cluster (`ClusterConnection`).

A URL that lists several seeds (`redis://h:7000,redis://h:7001`) is a cluster. One URL may name
a cluster node too: `probed` asks it once at start (`INFO cluster`) and hands back a
ClusterConnection when it is one; other code that needs a connection of its own to the same
Redis (a blocking reader, a registry follower) asks `connection_like`, which keeps the kind.
"""

from __future__ import annotations

from stateworker.errors import ConfigError
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.cluster_map import is_cluster_url
from stateworker.transport.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    RedisConnection,
    url_user,
)
from stateworker.transport.wire import ConnectionLost, ReplyError


def connection_for(url: str, *, write_first_at_once: bool = True,
                   connect_timeout_s: float | None = DEFAULT_CONNECT_TIMEOUT_S,
                   read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S) -> RedisConnection:
    """A connection to `url`: a cluster when it lists several seeds, else one server (which
    `probed` may still find to be a cluster node)."""
    kind = ClusterConnection if is_cluster_url(url) else RedisConnection
    return kind(url, write_first_at_once=write_first_at_once,
                connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)


def connection_like(conn: RedisConnection, *, write_first_at_once: bool | None = None,
                    read_timeout_s: float | None = None) -> RedisConnection:
    """Another connection to the Redis (or cluster) `conn` is on, with its timeouts unless
    given (a blocking reader sets its own read timeout)."""
    kind = ClusterConnection if isinstance(conn, ClusterConnection) else RedisConnection
    return kind(conn.url,
                write_first_at_once=conn.write_first_at_once if write_first_at_once is None
                else write_first_at_once,
                connect_timeout_s=conn.connect_timeout_s,
                read_timeout_s=conn.read_timeout_s if read_timeout_s is None else read_timeout_s)


async def probed(conn: RedisConnection, *, as_user: bool = True) -> RedisConnection:
    """`conn`, or a ClusterConnection in its place (closed) when the one server it names is a
    Redis Cluster node (INFO cluster: cluster_enabled:1). Asked once, at start.
    `as_user=False` (a client's or a watch's): a URL that names an ACL user is not asked (a
    principal's rule has no INFO, and the refusal would be logged as one); such a user names
    a cluster by listing its seeds."""
    if isinstance(conn, ClusterConnection) or (not as_user and url_user(conn.url) is not None):
        return conn
    try:
        info = await conn.execute("INFO", "cluster")
    except ReplyError as exc:
        if str(exc).startswith("NOPERM"):  # a user that may not ask (a principal): one server
            return conn
        raise ConfigError(f"Redis at {conn.shown} is not usable: {exc}") from exc
    except ConnectionLost as exc:
        raise ConfigError(f"Redis at {conn.shown} is not usable: {exc}") from exc
    if b"cluster_enabled:1" not in info:
        return conn
    await conn.close()
    return ClusterConnection(conn.url, write_first_at_once=conn.write_first_at_once,
                             connect_timeout_s=conn.connect_timeout_s,
                             read_timeout_s=conn.read_timeout_s)
