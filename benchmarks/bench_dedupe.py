"""The dedupe part of `stateworker bench`: Redis memory per bus call kept for the dedupe window
("dedupe bytes per call"), beside the two-key layout of before written raw, as a ratio.

One fresh redis-server (embedded, no snapshot) and a `stateworker serve` process. 64 keys are
written first; then CALLS `state::set` calls with fresh ids overwrite them with a value of the
same size, so the entries do not grow. The records' cost is the growth of Redis's memory (less
client and AOF buffers) less the growth of every stream (the events, the bus stream), by
`MEMORY USAGE ... SAMPLES 0`. The raw side writes what the two-key layout kept for the same
ids on the same server: `SET <prefix>:{<prefix>:p<n>}:call:<id> <40 hex><reply> PX` and `SET
<prefix>:callid:{<id>} <40 hex> PX`, the reply one the records hold.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from benchmarks.bench_bus import start_service
from stateworker.bus.client import StateClient
from stateworker.keys import KeySpace, call_field
from stateworker.scripts.bindings import DIGEST_BYTES
from stateworker.settings import Settings
from stateworker.transport.embedded import EmbeddedRedis

PREFIX = "benchdd"
# Some hundreds of records per slice of each of the 64 buckets (the hash tables' bucket
# arrays then weigh as they do at any rate: 8-16 bytes a record).
CALLS = 48_000
CONCURRENCY = 64
VALUES = (b'{"n":1}', b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}')  # the others' value
TARGET = 150  # bytes per call (issue 20)


async def _memory(raw: aredis.Redis) -> int:
    """Redis's memory less the buffers of clients and the AOF, which come and go."""
    info = await raw.info("memory")
    return int(info["used_memory"]) - int(info["mem_clients_normal"]) - int(
        info.get("mem_aof_buffer", 0))


async def _streams(raw: aredis.Redis) -> int:
    total = 0
    async for name in raw.scan_iter(match=f"{PREFIX}:*", count=1000, _type="stream"):
        total += int(await raw.memory_usage(name, samples=0) or 0)
    return total


async def _records(raw: aredis.Redis) -> int:
    """MEMORY USAGE of every slice of records (SAMPLES 0: every field counted)."""
    total = 0
    async for name in raw.scan_iter(match=f"{PREFIX}:calls:*", count=1000):
        total += int(await raw.memory_usage(name, samples=0) or 0)
    return total


async def _encodings(raw: aredis.Redis) -> dict[str, int]:
    """How many slices of records are hash tables, how many listpacks."""
    counts: dict[str, int] = {}
    async for name in raw.scan_iter(match=f"{PREFIX}:calls:*", count=1000):
        encoding = (await raw.object("encoding", name) or b"?").decode()
        counts[encoding] = counts.get(encoding, 0) + 1
    return counts


async def _footprint(raw: aredis.Redis) -> int:
    return await _memory(raw) - await _streams(raw)


async def _ours(client: StateClient, ids: list[str], value: bytes) -> None:
    async def writer(w: int) -> None:
        for i in range(w, len(ids), CONCURRENCY):
            await client.call_json("state::set", b'{"scope":"bench%d","key":"k%d","value":%s}'
                                   % (len(value), i % CONCURRENCY, value), call_id=ids[i])

    async with anyio.create_task_group() as tg:
        for w in range(CONCURRENCY):
            tg.start_soon(writer, w)


async def _a_reply(raw: aredis.Redis, call_id: str) -> bytes:
    """`call_id`'s recorded reply (msgpack), as the records hold it."""
    field = call_field(call_id)
    async for name in raw.scan_iter(match=f"{PREFIX}:calls:*", count=1000):
        value: bytes | None = await raw.hget(name, field)  # type: ignore[assignment]
        if value is not None:
            return value[DIGEST_BYTES:]
    raise RuntimeError("no call record found")


async def _raw_two_keys(raw: aredis.Redis, ids: list[str], reply: bytes, window_ms: int) -> None:
    part = KeySpace(PREFIX, Settings().partitions).for_scope("bench")
    digest = "0" * 40
    for start in range(0, len(ids), 1000):
        async with raw.pipeline(transaction=False) as pipe:
            for call_id in ids[start:start + 1000]:
                pipe.set(f"{part.tag}call:{call_id}", digest.encode() + reply, px=window_ms)
                pipe.set(f"{PREFIX}:callid:{{{call_id}}}", digest, px=window_ms)
            await pipe.execute()


async def _case(client: StateClient, raw: aredis.Redis, value: bytes, window_ms: int
                ) -> dict[str, Any]:
    await _ours(client, [uuid.uuid4().hex for _ in range(CONCURRENCY * 4)], value)  # warm up
    ids = [f"{uuid.uuid4().hex[:16]}-{n}" for n in range(CALLS)]
    before, slices = await _footprint(raw), await _records(raw)
    await _ours(client, ids, value)
    ours = (await _footprint(raw) - before) / CALLS
    usage = (await _records(raw) - slices) / CALLS
    encodings = await _encodings(raw)
    reply = await _a_reply(raw, ids[-1])
    before = await _footprint(raw)
    await _raw_two_keys(raw, ids, reply, window_ms)
    two_keys = (await _footprint(raw) - before) / CALLS
    return {"value_bytes": len(value), "reply_bytes": len(reply), "ours": round(ours, 1),
            "memory_usage": round(usage, 1), "two_keys": round(two_keys, 1),
            "ours_vs_two_keys": round(ours / two_keys, 3),
            "slices": encodings}


async def dedupe_section(out: Any) -> dict[str, Any]:
    window_ms = Settings().dedupe_window_ms
    cases = []
    with tempfile.TemporaryDirectory(prefix="sw-bench-dedupe-") as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        service = start_service(server.url, PREFIX)
        raw = aredis.Redis(unix_socket_path=str(server.socket))
        try:
            async with StateClient(settings=Settings(redis_url=server.url,
                                                     prefix=PREFIX)) as client:
                for value in VALUES:
                    cases.append(await _case(client, raw, value, window_ms))
        finally:
            service.terminate()
            service.wait(timeout=30)
            await raw.aclose()
            await server.stop()
    print(f"\n{'dedupe bytes per call':<28}{'calls':>7}{'ours':>8}{'usage':>7}{'two keys':>10}"
          f"{'ratio':>8}{'target':>8}", file=out)
    for case in cases:
        name = f"state::set, {case['value_bytes']} B value"
        print(f"{name:<28}{CALLS:>7}{case['ours']:>8.0f}{case['memory_usage']:>7.0f}"
              f"{case['two_keys']:>10.0f}"
              f"{case['ours_vs_two_keys']:>8.2f}{TARGET:>8}", file=out)
    print("ours = Redis's memory grown less the streams' growth; usage = MEMORY USAGE of the "
          f"record slices grown; slices: {cases[-1]['slices']}", file=out)
    print(f"two keys = the layout before (a :call: and a :callid: string per call, PX), written "
          f"raw for the same {CALLS:,} ids with the reply the records hold (the old value "
          f"included: {', '.join(str(c['reply_bytes']) for c in cases)} bytes)", file=out)
    return {"calls": CALLS, "target": TARGET, "cases": cases}
