"""The floor bench's line 5 (benchmarks/bench_floor.py): `strict` (appendfsync always) bus
`state::set` against etcd puts (Debian's etcd-server, aetcd), 64 in flight and one at a time;
the fsyncs per strict call counted with strace on redis-server; strict `get` against fast
`get`. Without etcd or aetcd the etcd figures say why; without strace the fsync counts are None.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio

from benchmarks.bench_durability import durability_mode
from benchmarks.benchtime import Op, percentile, timed
from benchmarks.floor_process import VALUE, median, stop_process
from benchmarks.pgserver import free_port

STRACE_CALLS = 300


class Server(NamedTuple):
    """A server the bench started: the port its clients use, its pid (for its CPU)."""

    port: int
    pid: int


@contextlib.contextmanager
def etcd_server(directory: Path) -> Iterator[Server | None]:
    """Debian's etcd (one member, its data in `directory`) on free ports, None when etcd is
    not installed."""
    binary = shutil.which("etcd")
    if binary is None:
        yield None
        return
    client, peer = free_port(), free_port()
    process = subprocess.Popen(
        [binary, "--name", "floor", "--data-dir", str(directory),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"floor=http://127.0.0.1:{peer}", "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield Server(client, process.pid)
    finally:
        stop_process(process)


@contextlib.asynccontextmanager
async def etcd_client(port: int | None) -> AsyncIterator[Any]:
    """An aetcd client (one gRPC channel, as a client process has) once etcd serves, or a
    text saying why there is none."""
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
        yield client
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def etcd_ops(port: int | None) -> AsyncIterator[dict[str, Op] | str]:
    """`put` through aetcd, or why none."""
    async with etcd_client(port) as client:
        if isinstance(client, str):
            yield client
            return

        async def put(w: int, i: int) -> Any:
            return await client.put(b"bench/k%d" % w, VALUE)

        yield {"put": put}


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
            etcd_server(Path(tmp) / "etcd") as etcd_process:
        async with durability_mode(Path(tmp) / "fast", "fast") as fast, \
                durability_mode(Path(tmp) / "strict", "strict") as strict, \
                etcd_ops(etcd_process and etcd_process.port) as etcd:
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
            figures["ops_per_s"] = {name: round(median(r)) for name, r in rates.items()}
            figures["p50_ms"] = {name: round(median(p) * 1000, 3)
                                 for name, p in p50s.items()}
            pid = strict.server.pid
            if pid is not None:
                figures["fsyncs_per_set"] = await _count_fsyncs(pid, strict["bus"],
                                                                STRACE_CALLS)
                figures["fsyncs_per_get"] = await _count_fsyncs(pid, strict["bus_get"],
                                                                STRACE_CALLS)
    return figures
