"""The floor bench's line 6 (benchmarks/bench_floor.py): Redis memory per entry (less the event
stream) against a plain SET of the same value, on a redis-server with its default settings,
for 100,000 entries of 200 B and of 2 KiB (and 200 B tagged, and with an expiry), and where the
bytes go: MEMORY USAGE per key kind, OBJECT ENCODING, the events' bytes per partition.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from benchmarks.bench_dedupe import _memory
from benchmarks.floor_process import stop_process
from stateworker.state.api import StateStore

ENTRIES = 100_000
BATCH = 100  # entries per set-many of the memory fill


@contextlib.asynccontextmanager
async def default_redis(directory: Path) -> AsyncIterator[str]:
    """redis-server with its default settings (no config file of ours; TCP off, a unix
    socket, no snapshots, so nothing forks while we measure): its socket's path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "redis.sock"
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700",
         "--dir", str(directory), "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with anyio.fail_after(15):
            while not path.exists():
                await anyio.sleep(0.02)
        yield str(path)
    finally:
        stop_process(process)


def json_value(size: int) -> bytes:
    """A JSON object of exactly `size` bytes."""
    head = b'{"name":"bench","n":12345,"tags":["a","b"],"pad":"'
    return head + b"x" * (size - len(head) - 2) + b'"}'


async def _usage(raw: aredis.Redis, pattern: str, kind: str | None = None) -> tuple[int, int]:
    """Total MEMORY USAGE (SAMPLES 0) of the keys matching `pattern`, and their count."""
    total = count = 0
    async for name in raw.scan_iter(match=pattern, count=1000, _type=kind):
        total += int(await raw.memory_usage(name, samples=0) or 0)
        count += 1
    return total, count


# The entries (untagged, no expiry), then the same 200 bytes tagged and with an expiry:
# each costs an index member more (and a few bytes in the entry), stated beside line 6.
MEMORY_CASES: tuple[tuple[int, str, bytes], ...] = (
    (200, "", b""), (2048, "", b""), (200, "tagged", b',"topic":"orders"'),
    (200, "with an expiry", b',"ttl_ms":86400000'))


async def memory_case(directory: Path, size: int, extra: bytes = b"") -> dict[str, Any]:
    """`extra`: more fields of each entry of the set-many (a topic, a ttl_ms)."""
    value = json_value(size)
    async with default_redis(directory) as path:
        raw = aredis.Redis(unix_socket_path=path)
        url = f"unix://{path}"
        try:
            async with StateStore.open(url, prefix="mem", reaper=False,
                                       allow_no_aof=True) as store:
                await store.call_json("state::set", b'{"scope":"warm","key":"up","value":1}')
                before = await _memory(raw)

                async def writer(w: int) -> None:  # set-many of BATCH entries, 8 in flight
                    for start in range(w * BATCH, ENTRIES, 8 * BATCH):
                        entries = b",".join(b'{"key":"k%06d","value":%s%s}' % (i, value, extra)
                                            for i in range(start, start + BATCH))
                        await store.call_json("state::set-many", b'{"scope":"mem","entries":[%s]}'
                                              % entries)

                async with anyio.create_task_group() as tg:
                    for w in range(8):
                        tg.start_soon(writer, w)
                after = await _memory(raw)
                part = store.state.keys.for_scope("mem")
            events, _ = await _usage(raw, "mem:*", "stream")
            sample = [part.entry("mem", f"k{i:06d}") for i in range(0, ENTRIES, ENTRIES // 200)]
            entry = statistics.mean([int(await raw.memory_usage(n, samples=0) or 0)
                                     for n in sample])
            encoding = (await raw.object("encoding", sample[0]) or b"?").decode()
            indexes = {name: int(await raw.memory_usage(key, samples=0) or 0) / ENTRIES
                       for name, key in (("k", part.key_index("mem")),
                                         ("u", part.entry_prefix[:-2] + "u:mem"),
                                         ("t", part.entry_prefix[:-2] + "t:mem"),
                                         ("ttl", part.ttl))}
            records, record_keys = await _usage(raw, "mem:*calls*")
            xlen = sum([int(await raw.xlen(n)) async for n in
                        raw.scan_iter(match="mem:*", count=1000, _type="stream")])
            ours = (after - before - events) / ENTRIES
            before = await _memory(raw)
            for start in range(0, ENTRIES, 1000):
                async with raw.pipeline(transaction=False) as pipe:
                    for i in range(start, start + 1000):
                        pipe.set(f"plain:mem:k{i:06d}", value)
                    await pipe.execute()
            plain = (await _memory(raw) - before) / ENTRIES
            plain_key = int(await raw.memory_usage("plain:mem:k000000", samples=0) or 0)
        finally:
            await raw.aclose()
    return {"value_bytes": size, "entries": ENTRIES, "ours": round(ours, 1),
            "with_events": round(ours + events / ENTRIES, 1), "plain_set": round(plain, 1),
            "ratio": round(ours / plain, 3),
            "entry_memory_usage": round(entry, 1), "entry_encoding": encoding,
            "index_bytes_per_member": {k: round(v, 1) for k, v in indexes.items()},
            "records_bytes": records, "record_keys": record_keys,
            "events_bytes": events, "events_retained": xlen,
            "event_bytes_each": round(events / xlen, 1) if xlen else None,
            "plain_set_memory_usage": plain_key,
            "entry_key_example": sample[0]}


async def memory_lines() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sw-bench-floor-mem-") as tmp:
        cases = []
        for n, (size, label, extra) in enumerate(MEMORY_CASES):
            case = await memory_case(Path(tmp) / str(n), size, extra)
            cases.append({**case, "entries_are": label})
        return {"cases": cases}
