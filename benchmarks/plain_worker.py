"""A plain hand-written redis-py worker for the `state` service's `state::set`: the reference
of issue 24's "Must show" 1 and 3 (`benchmarks/floor_bus.py`).

It speaks the bus protocol (docs/bus-protocol.md) just enough for a `StateClient` to call it:
it reads `<prefix>:bus:state` with the group `state` (`XREADGROUP COUNT 64`), runs one
pipeline of EVALSHA of a minimal HSET+XADD script per batch (the value of each call's body
into `<prefix>:{<scope>}:<key>`, an event to `<prefix>:{<scope>}:events`: one slot per scope,
so it runs on a Redis Cluster too, with a seed list for a URL), then one pipeline with one
LPUSH per reply list (`{"id":…,"ok":true,"result":{"revision":…}}`) and one XACK for the
batch. No call-id binding, no deadline, no record, no PEXPIRE, no XDEL, no validation beyond
the body's decode: a fraction of the service's work.

Run as its own process (`python -m benchmarks.plain_worker --redis-url unix:///… --prefix
P`), so its CPU ticks can be read from /proc; it prints `{"ready":true}` once its group
exists and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import msgspec
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from benchmarks.benchtime import RAW_SET_LUA

GROUP = "state"
COUNT = 64


class _SetBody(msgspec.Struct):
    scope: str
    key: str
    value: msgspec.Raw


_decode = msgspec.json.Decoder(_SetBody).decode


def _connect(url: str) -> Any:
    if "," in url:  # a seed list: a Redis Cluster
        nodes = [ClusterNode(seed.split("//")[1].split(":")[0], int(seed.rsplit(":", 1)[1]))
                 for seed in url.split(",")]
        return RedisCluster(startup_nodes=nodes)
    if url.startswith("unix://"):
        return aredis.Redis(unix_socket_path=url[len("unix://"):])
    return aredis.Redis.from_url(url)


async def serve(url: str, prefix: str) -> None:
    redis = _connect(url)
    stream = f"{prefix}:bus:state"
    try:
        await redis.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except aredis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    sha = await redis.script_load(RAW_SET_LUA)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print('{"ready":true}', flush=True)
    while not stop.is_set():
        read: Any = await redis.xreadgroup(GROUP, "plain", {stream: ">"}, count=COUNT,
                                           block=200)
        if not read:
            continue
        entries = read[0][1]
        calls: list[tuple[bytes, bytes, bytes]] = []  # (entry id, call id, reply list)
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in entries:
                body = _decode(fields[b"body"])
                # (execute_command: redis-py's cluster pipeline refuses its evalsha method, not
                # the command, which it routes by its keys)
                pipe.execute_command("EVALSHA", sha, 2, f"{prefix}:{{{body.scope}}}:{body.key}",
                                     f"{prefix}:{{{body.scope}}}:events", bytes(body.value),
                                     entry_id)
                calls.append((entry_id, fields[b"id"], fields.get(b"reply", b"")))
            results = await pipe.execute()
        replies: dict[bytes, list[bytes]] = {}
        for (_, call_id, reply), revision in zip(calls, results, strict=True):
            if reply:
                replies.setdefault(reply, []).append(
                    b'{"id":' + msgspec.json.encode(call_id.decode())
                    + b',"ok":true,"result":{"revision":"' + revision + b'"}}')
        async with redis.pipeline(transaction=False) as pipe:
            for reply, documents in replies.items():
                pipe.lpush(reply, *documents)
            pipe.xack(stream, GROUP, *(entry_id for entry_id, _, _ in calls))
            await pipe.execute()
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plain_worker", description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.run(serve(args.redis_url, args.prefix))
    except ImportError:
        asyncio.run(serve(args.redis_url, args.prefix))
    sys.exit(0)


if __name__ == "__main__":
    main()
