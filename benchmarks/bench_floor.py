"""Issue 24's harness, "the bus at its floor" (`scripts/bench --sections floor`): every "Must
show" ratio of the issue measured as the bus stands, one table: ours, the reference, the ratio
and the issue's target. Each pair is measured in the same run, in alternation (medians of the
rounds), so the load of this shared machine hits both sides alike.

1. bus `state::set`, 64 in flight, vs in-process `StateStore.set` and vs a plain redis-py
   worker (`benchmarks/plain_worker.py`, its own process) called by the same `StateClient`;
2. one call at a time, interleaved (bus call, raw call, ...): bus p50 vs one raw EVALSHA;
3. CPU per call at 64 in flight of the `stateworker serve` process vs the plain worker's
   (utime + stime from /proc/<pid>/stat around each measurement);
4. bus `set` with 10 triggers registered (each matching one of the 10 scopes written, calls
   delivered to a stream nobody reads; a second service on its own prefix) vs none; write ->
   handler start p99 at 1,000 events/s with those 10 triggers registered (bench_reactive's);
5. `strict` (appendfsync always) bus `set` at 64 vs etcd puts at 64 (Debian's etcd-server,
   data in the same temporary directory as Redis's, aetcd); fsyncs per call counted with
   strace on redis-server; strict `get` vs fast `get`, one at a time;
6. Redis memory per entry (less the event stream) vs a plain SET of the same value, on a
   redis-server with default settings, for 100,000 entries of 200 B and of 2 KiB, where the
   bytes go (MEMORY USAGE per key kind, OBJECT ENCODING), the events' bytes per partition;
7. 1 and 3 again on a 3+3 Redis Cluster (tests/cluster.py; the service with 3 bus shards),
   as a second table.

Without etcd or aetcd the etcd lines say so and the rest runs. What each line measures, and
what the figures decided: docs/decisions/0022-the-bus-cost-floor.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from benchmarks import bench_reactive
from benchmarks.bench_bus import start_service, started
from benchmarks.bench_dedupe import _memory
from benchmarks.bench_durability import durability_mode
from benchmarks.benchtime import RAW_SET_LUA, Op, percentile, timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore

PREFIX, TRIGGERED, PLAIN = "benchfloor", "benchfloortrig", "benchplain"
VALUE = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'
ENTRIES = 100_000
BATCH = 100  # entries per set-many of the memory fill
STRACE_CALLS = 300
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str) -> float:
    """utime + stime (s) of a /proc/<pid>/stat line: fields 14 and 15, counted after the
    command's closing parenthesis (a command may hold spaces and parentheses)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def process_cpu(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


async def timed_cpu(op: Op, concurrency: int, seconds: float, pid: int | None = None
                    ) -> tuple[float, list[float], float]:
    """`timed`, plus the CPU seconds per op of process `pid` over the measurement."""
    before = process_cpu(pid) if pid else 0.0
    rate, latencies = await timed(op, concurrency, seconds)
    cpu = (process_cpu(pid) - before) / len(latencies) if pid and latencies else 0.0
    return rate, latencies, cpu


def set_op(caller: Any) -> Op:
    """A `state::set` of VALUE through `caller` (a StateClient or StateStore): worker w
    writes key k<w> of scope s<w % 10> (the scopes the 10 triggers match)."""
    async def op(w: int, i: int) -> Any:
        return await caller.call_json(
            "state::set", b'{"scope":"s%d","key":"k%d","value":%s}' % (w % 10, w, VALUE))
    return op


def start_plain_worker(url: str, prefix: str = PLAIN) -> subprocess.Popen[str]:
    return started([sys.executable, "-m", "benchmarks.plain_worker", "--redis-url", url,
                    "--prefix", prefix], '"ready"', "the plain worker")


def _stop(process: subprocess.Popen[Any]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def _alternated(ops: dict[str, tuple[Any, int | None]], seconds: float, rounds: int,
                      redis_pid: int | None = None
                      ) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """Each side's rate and CPU per call at 64 in flight, the sides in alternation each round
    (a side's pid: its serving process, whose CPU is the side's "server"; None: none). Per
    call, with `redis_pid`: the CPU of this process ("caller": whichever side's client runs,
    the others idle), of the server and of redis-server ("redis")."""
    rates: dict[str, list[float]] = {name: [] for name in ops}
    cpus: dict[str, dict[str, list[float]]] = {
        name: {"server": [], "caller": [], "redis": []} for name in ops}
    for _ in range(rounds):
        for name, (op, pid) in ops.items():
            caller, redis = time.process_time(), process_cpu(redis_pid) if redis_pid else 0.0
            rate, latencies, cpu = await timed_cpu(op, 64, seconds, pid)
            calls = max(1, len(latencies))
            rates[name].append(rate)
            cpus[name]["server"].append(cpu)
            cpus[name]["caller"].append((time.process_time() - caller) / calls)
            if redis_pid:
                cpus[name]["redis"].append((process_cpu(redis_pid) - redis) / calls)
    return rates, cpus


def _budget(cpus: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per side, the medians (us per call) of each process's CPU and their sum."""
    out: dict[str, dict[str, float]] = {}
    for name, parts in cpus.items():
        medians = {part: round(_median(values) * 1e6, 1) for part, values in parts.items()}
        out[name] = {**medians, "total": round(sum(medians.values()), 1)}
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


# --- 1 to 4: one Redis (the run's), two services, the plain worker, the store -----------------

async def bus_lines(url: str, socket_path: str, seconds: float, rounds: int) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    triggered = start_service(url, TRIGGERED)
    plain = start_plain_worker(url)
    raw = aredis.Redis(unix_socket_path=socket_path)
    script = raw.register_script(RAW_SET_LUA)
    figures: dict[str, Any] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                StateClient(settings=Settings(redis_url=url, prefix=PREFIX)))
            trig_settings = Settings(redis_url=url, prefix=TRIGGERED)
            trig_client = await stack.enter_async_context(StateClient(settings=trig_settings))
            plain_client = await stack.enter_async_context(
                StateClient(settings=Settings(redis_url=url, prefix=PLAIN)))
            store = await stack.enter_async_context(
                StateStore.open(url, prefix=PREFIX, reaper=False))
            await bench_reactive.register_ten(trig_client)
            ops = {"bus": (set_op(client), service.pid), "store": (set_op(store), None),
                   "plain": (set_op(plain_client), plain.pid),
                   "triggers": (set_op(trig_client), triggered.pid)}
            for op, _ in ops.values():
                await op(0, 0)  # warm up: scripts loaded, groups made
            redis_pid = int((await raw.info("server"))["process_id"])
            rates, cpus = await _alternated(ops, seconds, rounds, redis_pid)
            figures["set_64_ops_per_s"] = {name: round(_median(r)) for name, r in rates.items()}
            figures["cpu_us_per_call_64"] = {
                name: round(_median(cpus[name]["server"]) * 1e6, 1)
                for name in ("bus", "plain", "triggers")}
            figures["budget_us_per_call_64"] = _budget(cpus)

            # 2: one at a time, interleaved: bus call, raw EVALSHA, bus call ...
            bus_one, raw_one = set_op(client), 0
            bus_lat: list[float] = []
            raw_lat: list[float] = []
            end = time.perf_counter() + seconds * rounds
            while time.perf_counter() < end:
                start = time.perf_counter()
                await bus_one(0, raw_one)
                bus_lat.append(time.perf_counter() - start)
                start = time.perf_counter()
                await script(keys=["raw:{b}:0", "raw:{b}:events"], args=[VALUE, raw_one])
                raw_lat.append(time.perf_counter() - start)
                raw_one += 1
            figures["one_at_a_time"] = {
                "calls": len(bus_lat),
                "bus_p50_ms": round(percentile(bus_lat, 0.5) * 1000, 3),
                "raw_evalsha_p50_ms": round(percentile(raw_lat, 0.5) * 1000, 3),
                "bus_p99_ms": round(percentile(bus_lat, 0.99) * 1000, 3),
                "raw_evalsha_p99_ms": round(percentile(raw_lat, 0.99) * 1000, 3)}

            # 4: write -> handler start at 1,000 events/s, the 10 triggers registered
            figures["handler_latency_10_triggers"] = (
                await bench_reactive.write_to_handler_latency(trig_client, trig_settings,
                                                              seconds * rounds))
            await bench_reactive.unregister_ten(trig_client)
    finally:
        for process in (service, triggered, plain):
            _stop(process)
        await raw.aclose()
    return figures


# --- 5: strict mode against etcd ----------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def etcd_server(directory: Path) -> Iterator[int | None]:
    """Debian's etcd (one member, its data in `directory`) on free ports: its client port,
    None when etcd is not installed."""
    binary = shutil.which("etcd")
    if binary is None:
        yield None
        return
    client, peer = _free_port(), _free_port()
    process = subprocess.Popen(
        [binary, "--name", "floor", "--data-dir", str(directory),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"floor=http://127.0.0.1:{peer}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield client
    finally:
        _stop(process)


@contextlib.asynccontextmanager
async def etcd_ops(port: int | None) -> AsyncIterator[dict[str, Op] | str]:
    """`put` through aetcd (one gRPC channel, as a client process has), or why none."""
    if port is None:
        yield "etcd is not installed (Debian's etcd-server: scripts/_setup.sh ensure_etcd)"
        return
    try:
        import aetcd  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        yield "aetcd is not installed (the bench extra of pyproject.toml: ./scripts/bench installs it)"
        return
    client = aetcd.Client("127.0.0.1", port)
    try:
        with anyio.fail_after(30):
            while True:  # etcd elects itself leader, then serves
                try:
                    await client.put(b"bench/warm", b"up")
                    break
                except Exception:
                    await anyio.sleep(0.1)

        async def put(w: int, i: int) -> Any:
            return await client.put(b"bench/k%d" % w, VALUE)

        yield {"put": put}
    finally:
        await client.close()


async def _count_fsyncs(pid: int, op: Op, calls: int) -> float | None:
    """fsync/fdatasync system calls of redis-server `pid` (all its threads, strace -f) while
    `calls` ops run one at a time, per op; None without strace (or when it cannot attach)."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    with tempfile.NamedTemporaryFile(prefix="sw-floor-strace-", suffix=".txt") as log:
        tracer = subprocess.Popen(
            [strace, "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", log.name, "-p",
             str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await anyio.sleep(1.0)  # attached to every thread
        if tracer.poll() is not None:
            return None
        for i in range(calls):
            await op(0, i)
        await anyio.sleep(0.2)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
        text = Path(log.name).read_text()
    return sum(1 for line in text.splitlines()
               if "fsync(" in line or "fdatasync(" in line) / calls


async def strict_lines(seconds: float, rounds: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sw-bench-floor-") as tmp, \
            etcd_server(Path(tmp) / "etcd") as port:
        async with durability_mode(Path(tmp) / "fast", "fast") as fast, \
                durability_mode(Path(tmp) / "strict", "strict") as strict, \
                etcd_ops(port) as etcd:
            cases: list[tuple[str, Op, int]] = [
                ("strict_set_64", strict["bus"], 64), ("strict_set_1", strict["bus"], 1),
                ("fast_get_1", fast["bus_get"], 1), ("strict_get_1", strict["bus_get"], 1)]
            if isinstance(etcd, dict):
                cases[1:1] = [("etcd_put_64", etcd["put"], 64)]
                cases.append(("etcd_put_1", etcd["put"], 1))
            else:
                figures["etcd"] = etcd
            for w in range(64):
                await strict["bus"](w, 0)  # the keys the gets read
                await fast["bus"](w, 0)
            rates: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            p50s: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            for _ in range(rounds):
                for name, op, concurrency in cases:
                    rate, latencies = await timed(op, concurrency, seconds)
                    rates[name].append(rate)
                    p50s[name].append(percentile(latencies, 0.5))
            figures["ops_per_s"] = {name: round(_median(r)) for name, r in rates.items()}
            figures["p50_ms"] = {name: round(_median(p) * 1000, 3)
                                 for name, p in p50s.items()}
            pid = strict.server.pid
            if pid is not None:
                figures["fsyncs_per_set"] = await _count_fsyncs(pid, strict["bus"],
                                                                STRACE_CALLS)
                figures["fsyncs_per_get"] = await _count_fsyncs(pid, strict["bus_get"],
                                                                STRACE_CALLS)
    return figures


# --- 6: memory per entry on a redis-server with default settings --------------------------------

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
        _stop(process)


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


# The issue's entries (untagged, no expiry), then the same 200 bytes tagged and with an expiry:
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


# --- 7: ratios 1 and 3 on the 3+3 cluster ------------------------------------------------------

async def cluster_lines(seconds: float, rounds: int) -> dict[str, Any]:
    """Bus `set` at 64 (STATEWORKER_BUS_SHARDS=3, as bench_cluster's cluster side) vs the
    in-process store and the plain worker (its one stream, each scope's keys in one slot) on
    one 3+3 cluster (tests/cluster.py), with the service's and the plain worker's CPU per call."""
    from benchmarks.bench_cluster import RedisCluster  # (starts nothing at import)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sw-bench-floor-cluster-") as tmp:
        cluster = RedisCluster(Path(tmp) / "cluster")
        cluster.start()
        urls: str = cluster.urls
        service = plain = None
        try:
            service = start_service(urls, PREFIX, env={"STATEWORKER_BUS_SHARDS": "3"})
            plain = start_plain_worker(urls)
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(StateClient(
                    settings=Settings(redis_url=urls, prefix=PREFIX, bus_shards=3)))
                plain_client = await stack.enter_async_context(
                    StateClient(settings=Settings(redis_url=urls, prefix=PLAIN)))
                store = await stack.enter_async_context(
                    StateStore.open(urls, prefix=PREFIX, reaper=False))
                ops = {"bus": (set_op(client), service.pid), "store": (set_op(store), None),
                       "plain": (set_op(plain_client), plain.pid)}
                for op, _ in ops.values():
                    for w in range(10):
                        await op(w, 0)  # warm up: scripts loaded on every primary
                rates, cpus = await _alternated(ops, seconds, rounds)
            figures["set_64_ops_per_s"] = {name: round(_median(r)) for name, r in rates.items()}
            figures["cpu_us_per_call_64"] = {name: round(_median(cpus[name]["server"]) * 1e6, 1)
                                             for name in ("bus", "plain")}
        finally:
            for process in (service, plain):
                if process is not None:
                    _stop(process)
            cluster.kill()
    return figures


# --- the section ----------------------------------------------------------------------------

def _line(out: Any, rows: list[dict[str, Any]], measure: str, ours: float, ref: float | None,
          reference: str, target: str, fmt: str = ",.0f", ratio: float | None = None,
          note: str = "") -> None:
    if ratio is None and ref:
        ratio = ours / ref
    row = {"measure": measure, "ours": ours, "reference": reference, "ref": ref,
           "ratio": None if ratio is None else round(ratio, 3), "target": target}
    if note:
        row["note"] = note
    rows.append(row)
    ref_text = "-" if ref is None else format(ref, fmt)
    ratio_text = "-" if ratio is None else f"{ratio:.2f}"
    print(f"{measure:<44}{format(ours, fmt):>10}  {reference:<34}{ref_text:>10}"
          f"{ratio_text:>7}  {target}{('  ' + note) if note else ''}", file=out)


async def floor_section(url: str, socket_path: str, seconds: float, rounds: int, out: Any,
                        cluster: bool = True) -> dict[str, Any]:
    figures: dict[str, Any] = {"uptime": Path("/proc/loadavg").read_text().strip()}
    figures["bus"] = await bus_lines(url, socket_path, seconds, rounds)
    figures["strict"] = await strict_lines(seconds, rounds)
    figures["memory"] = await memory_lines()
    if cluster:
        figures["cluster"] = await cluster_lines(seconds, rounds)
    rows: list[dict[str, Any]] = []
    figures["rows"] = rows
    bus, strict = figures["bus"], figures["strict"]
    rate, cpu, one = bus["set_64_ops_per_s"], bus["cpu_us_per_call_64"], bus["one_at_a_time"]
    print(f"\n{'floor (issue 24)':<44}{'ours':>10}  {'reference':<34}{'ref':>10}{'ratio':>7}"
          f"  target", file=out)
    _line(out, rows, "1 bus set/s, 64 in flight", rate["bus"], rate["store"],
          "StateStore.set/s in process, 64", ">= 0.6")
    _line(out, rows, "1 bus set/s, 64 in flight", rate["bus"], rate["plain"],
          "plain redis-py worker/s, 64", ">= 1.5")
    _line(out, rows, "2 bus set p50 ms, one at a time", one["bus_p50_ms"],
          one["raw_evalsha_p50_ms"], "raw EVALSHA p50 ms, interleaved", "<= 2.5", ".3f")
    _line(out, rows, "3 service CPU us/call, 64 in flight", cpu["bus"], cpu["plain"],
          "plain worker's CPU us/call", "<= 0.5", ".1f")
    _line(out, rows, "4 bus set/s, 10 triggers registered", rate["triggers"], rate["bus"],
          "bus set/s, none (another service)", ">= 0.9")
    print("1 CPU us per call at 64 in flight, by process (caller: the bench's client; server: "
          "the service or the plain worker):", file=out)
    for side, parts in bus["budget_us_per_call_64"].items():
        print(f"  {side:<9} caller {parts['caller']:>6.1f}  server {parts['server']:>6.1f}  "
              f"redis {parts['redis']:>6.1f}  total {parts['total']:>6.1f}", file=out)
    latency = bus["handler_latency_10_triggers"]
    _line(out, rows, "4 write -> handler start p99 ms @1000/s", latency["p99_ms"], None,
          f"(p50 {latency['p50_ms']:.3f} ms, {latency['events']}/{latency['of']})",
          "<= 10 ms", ".3f")
    ops, p50 = strict["ops_per_s"], strict["p50_ms"]
    etcd_note = strict.get("etcd", "")
    _line(out, rows, "5 strict bus set/s, 64 in flight", ops["strict_set_64"],
          ops.get("etcd_put_64"), "etcd put/s (aetcd), 64", ">= 1.0", note=etcd_note)
    _line(out, rows, "5 strict bus set p50 ms, one at a time", p50["strict_set_1"],
          p50.get("etcd_put_1"), "etcd put p50 ms, one at a time", "(issue's table)", ".3f")
    for kind in ("set", "get"):
        count = strict.get(f"fsyncs_per_{kind}")
        _line(out, rows, f"5 fsyncs per strict bus {kind} (strace)",
              -1 if count is None else count, None, "fsync+fdatasync of redis-server",
              "<= 2" if kind == "set" else "", ".2f",
              note="" if count is not None else "strace unavailable")
    _line(out, rows, "5 strict bus get/s, one at a time", ops["strict_get_1"], ops["fast_get_1"],
          "fast bus get/s, one at a time", ">= 0.8")
    for case in figures["memory"]["cases"]:
        label = case.get("entries_are", "")
        _line(out, rows, f"6 Redis B/entry, {case['value_bytes']} B value{', ' + label if label else ''}"
              ", no events", case["ours"], case["plain_set"], "plain SET B/key",
              "(stated)" if label else "<= 2x")
    print("6 where the bytes go (MEMORY USAGE, SAMPLES 0), per entry:", file=out)
    for case in figures["memory"]["cases"]:
        idx = case["index_bytes_per_member"]
        label = f" ({case['entries_are']})" if case.get("entries_are") else ""
        print(f"  {case['value_bytes']:>5} B value{label}: entry {case['entry_memory_usage']:.0f}"
              f" ({case['entry_encoding']}), index members k {idx['k']:.0f} u {idx['u']:.0f}"
              f" t {idx['t']:.0f} ttl {idx['ttl']:.0f}, records {case['records_bytes']} B in "
              f"{case['record_keys']} keys, plain SET key {case['plain_set_memory_usage']}; events retained "
              f"{case['events_retained']:,} in {case['events_bytes']:,} B "
              f"({case['event_bytes_each']} B each, one partition); with them "
              f"{case['with_events']:.0f} B/entry", file=out)
    if "cluster" in figures:
        rate, cpu = figures["cluster"]["set_64_ops_per_s"], figures["cluster"]["cpu_us_per_call_64"]
        print(f"\n{'floor on the 3+3 cluster (7)':<44}{'ours':>10}  {'reference':<34}{'ref':>10}"
              f"{'ratio':>7}  target", file=out)
        rows = figures["cluster_rows"] = []
        _line(out, rows, "1 bus set/s, 64 in flight, 3 shards", rate["bus"], rate["store"],
              "StateStore.set/s in process, 64", ">= 0.6")
        _line(out, rows, "1 bus set/s, 64 in flight, 3 shards", rate["bus"], rate["plain"],
              "plain redis-py worker/s, 64", ">= 1.5")
        _line(out, rows, "3 service CPU us/call, 64 in flight", cpu["bus"], cpu["plain"],
              "plain worker's CPU us/call", "<= 0.5", ".1f")
    print(f"load (/proc/loadavg at start): {figures['uptime']}", file=out)
    return figures
