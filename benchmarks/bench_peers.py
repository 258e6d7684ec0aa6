"""Peers (`scripts/bench --sections peers`, issue 43): the bus beside etcd and NATS JetStream KV,
each on this machine, side by side in one run, as ratios (>1: stateworker is better).

Six systems (eleven columns), each started by the bench on loopback with its data in one
temporary directory (one disk): stateworker `fast` and `strict` (a redis-server and a
`stateworker serve` each,
called through a StateClient: bench_durability's modes; `strict` with its bus on a second
redis-server, STATEWORKER_BUS_REDIS_URL, decision 0056; each also through its HTTP face,
`POST /v1/call` on 64 keep-alive connections: the `http` columns, their ops only, and the
servers' CPU per op beside the bus's: issue 43; `strict`'s writes also in this process,
StateStore.set on its Redis: the `store` column, set only; `strict` again on two replicas,
one a core, through the bus and through both HTTP faces: the `x2` columns, set and get),
etcd 3.4 (Debian's, through aetcd),
NATS JetStream KV at its default and with `sync_interval: always` (through nats-py), and a saq
job queue (its `set` only: benchmarks/peers_queues.py). For each
round, every measure runs on every system one after another, in the reverse order every other
round (set, get and compare-and-set at 64 in flight: ops/s; one at a time: p50; write -> watch
delivery p50/p99 at 1,000 writes/s for at least DELIVERY_S;
ours also write -> trigger handler start, beside the peers' watch; the deliveries on a quiet
machine, with the HTTP peers' idle connections closed, this process's heap frozen and the job
queue's polling worker stopped: `_round`);
the ratio of each pair is
taken per round and its median over the rounds is reported, with the medians of the figures.
CPU per op at 64 in flight of each system's processes (utime + stime from /proc) and of this
one (the caller: the client library's work).

Only like pairs are compared, by what each promises on disk when it replies (PROMISES): strict
with etcd and with NATS sync always; fast with NATS's default (which promises less: nothing
for up to 2 minutes). A system that cannot run here (not installed, too old) says why and its
ratios are None. ops in peers_ops.py, servers in peers_servers.py and floor_strict.py.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_durability import durability_mode
from benchmarks.benchtime import percentile, quiet
from benchmarks.floor_process import timed_cpus
from benchmarks.floor_strict import etcd_client, etcd_server
from benchmarks.peers_ops import (
    Peer,
    delivery_latency,
    etcd_peer,
    http_peer,
    nats_peer,
    replicas_peers,
    stateworker_peer,
)
from benchmarks.peers_queues import saq_peer
from benchmarks.peers_servers import nats_binary, nats_kv, nats_server, nats_version
from benchmarks.pgserver import free_port

PEERS = ("fast", "strict", "http_fast", "http", "store", "strict_x2", "http_x2", "etcd", "nats",
         "nats_sync", "saq")
PROMISES = {
    "fast": "stateworker fast: appendfsync everysec; a reply may come up to ~1 s before its fsync",
    "strict": "stateworker strict: appendfsync always; the reply after the write's fsync; "
              "the bus on a Redis of its own (STATEWORKER_BUS_REDIS_URL, everysec)",
    "http_fast": "stateworker fast through its HTTP face (POST /v1/call, keep-alive): the same service",
    "http": "stateworker strict through its HTTP face (POST /v1/call, keep-alive): the same service",
    "store": "stateworker strict in process: StateStore.set on the strict Redis (set only)",
    "strict_x2": "stateworker strict on two replicas, one a core (a second `stateworker serve` "
                 "on the same Redis and bus Redis: both serve the bus's calls); set and get",
    "http_x2": "the same two replicas through their HTTP faces, the 64 connections spread over "
               "both as a load balancer would; set and get",
    "etcd": "etcd 3.4: the entry fsynced to its WAL before the reply",
    "nats": "NATS JetStream default: written to the OS, fsynced every 2 min (sync_interval)",
    "nats_sync": "NATS JetStream sync_interval always: fsynced per write before the reply",
    "saq": "saq job (one SET by its worker, result awaited, polled every 10 ms): Redis everysec",
}
PAIRS = (("strict", "etcd"), ("strict", "nats_sync"), ("fast", "nats"), ("http", "etcd"),
         ("http_fast", "etcd"), ("http", "strict"), ("http_fast", "fast"), ("fast", "saq"),
         ("store", "etcd"), ("strict_x2", "etcd"), ("http_x2", "etcd"))
OPS = ("set", "get", "cas")
# A delivery's paced writes last at least this long a round (1,000 a second): a p99 of 1,000
# samples is their tenth slowest, which swung up to 2x from round to round on this machine.
DELIVERY_S = 3.0


def _rows() -> list[tuple[str, str, bool | None]]:
    """(row, unit, higher is better: None, not compared), in the table's order."""
    rows: list[tuple[str, str, bool | None]] = []
    for op in OPS:
        rows += [(f"{op} @64", "ops/s", True), (f"{op} @1 p50", "ms", False)]
    for kind in ("watch", "trigger"):
        rows += [(f"{kind} p50 @1000/s", "ms", False), (f"{kind} p99 @1000/s", "ms", False),
                 (f"{kind} delivered", "%", None)]
    for op in OPS:
        rows += [(f"{op} @64 CPU servers", "us/op", False), (f"{op} @64 CPU all", "us/op", False)]
    return rows


async def _round(peers: dict[str, Peer], seconds: float, tag: int) -> dict[str, dict[str, float]]:
    """One round: every measure on every peer, one after another (in the reverse order in
    every other round, so that no system always runs first or last); row -> peer -> figure."""
    got: dict[str, dict[str, float]] = {row: {} for row, _, _ in _rows()}
    order = list(peers.items()) if tag % 2 == 0 else list(peers.items())[::-1]
    for op in OPS:
        for concurrency in (64, 1):
            for name, peer in order:
                if op not in peer.ops:  # (a job queue: set only)
                    continue
                rate, latencies, cpus = await timed_cpus(peer.ops[op], concurrency, seconds,
                                                         peer.pids)
                if concurrency == 1:
                    got[f"{op} @1 p50"][name] = percentile(latencies, 0.5) * 1000
                    continue
                got[f"{op} @64"][name] = rate
                servers = sum(cpu for part, cpu in cpus.items() if part != "caller")
                got[f"{op} @64 CPU servers"][name] = servers * 1e6
                got[f"{op} @64 CPU all"][name] = (servers + cpus["caller"]) * 1e6
    paced = max(seconds, DELIVERY_S)
    # The HTTP peers' 64 keep-alive connections closed now: left idle, the service closes
    # them 5 s later (its keep-alive timeout), all at once, in the middle of a delivery
    # measure (it held deliveries up by 5-19 ms for ~50 ms: a p99 of its own).
    for peer in peers.values():
        if peer.idle is not None:
            await peer.idle()
    # What this process holds (every peer's client, the rounds' figures) frozen, as
    # `stateworker serve` freezes its own (stateworker/loop.py): a full collection here
    # took 30 ms on this 2-core machine, every 15-20 s of the 64-way measures, and one
    # falling in a delivery measure held up every peer's watch or our trigger's handler,
    # all of which run in this process.
    gc.collect()
    gc.freeze()
    # A job queue's worker, measured in no delivery, stopped meanwhile: saq's polls its Redis
    # ~90 times a second while idle (and its Redis answers), a wake-up every ~5 ms of the
    # cores every delivery shares.
    with paused([peer.pids["worker"] for peer in peers.values()
                 if peer.watch is None and "worker" in peer.pids]):
        await _deliveries(order, got, paced, tag)
    return got


async def _deliveries(order: list[tuple[str, Peer]], got: dict[str, dict[str, float]],
                      paced: float, tag: int) -> None:
    for name, peer in order:
        if peer.watch is None:
            continue
        # Latency at 1,000 writes/s is measured on a quiet machine: the background work the
        # 64-way measures left (AOF rewrites, etcd's snapshot, NATS's flushes) done first.
        await quiet()
        deliveries = {"watch": await delivery_latency(peer.watch(f"{tag}"), paced)}
        if peer.trigger is not None:
            await quiet()
            deliveries["trigger"] = await peer.trigger(paced)
        for kind, figure in deliveries.items():
            got[f"{kind} p50 @1000/s"][name] = figure["p50_ms"]
            got[f"{kind} p99 @1000/s"][name] = figure["p99_ms"]
            got[f"{kind} delivered"][name] = 100 * figure["events"] / figure["of"]


@contextlib.contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """The processes `pids` stopped (SIGSTOP) for the block, then continued."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def _ratio(row: str, better_high: bool | None, ours: str, theirs: str, got: dict[str, dict[str, float]]
           ) -> float | None:
    """`ours` against `theirs` in one round, >1 when ours is better; a trigger row against the
    peer's watch (the peers have no triggers: a watch is how they hand a change on)."""
    mine = got[row].get(ours)
    other = got[row.replace("trigger", "watch")].get(theirs)
    if not mine or not other or mine < 0 or other < 0:
        return None
    return mine / other if better_high else other / mine


async def peers_section(seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {"load": Path("/proc/loadavg").read_text().strip(),
                               "promises": PROMISES, "versions": _versions()}
    with tempfile.TemporaryDirectory(prefix="sw-bench-peers-") as tmp_name:
        async with contextlib.AsyncExitStack() as stack:
            per_round, missing = await _measure(stack, Path(tmp_name), seconds, rounds)
    figures["missing"] = missing
    figures["rows"] = _summary(per_round)
    _report(figures, out)
    return figures


async def _measure(stack: contextlib.AsyncExitStack, tmp: Path, seconds: float, rounds: int
                   ) -> tuple[list[dict[str, dict[str, float]]], dict[str, str]]:
    """Every system started (on `stack`), then the rounds: their figures, and why a system
    is missing."""
    etcd = stack.enter_context(etcd_server(tmp / "etcd"))
    nats = stack.enter_context(nats_server(tmp / "nats", sync_always=False))
    nats_sync = stack.enter_context(nats_server(tmp / "nats-sync", sync_always=True))
    peers: dict[str, Peer] = {}
    missing: dict[str, str] = {}
    for mode, http_name in (("fast", "http_fast"), ("strict", "http")):
        http = f"127.0.0.1:{free_port()}"  # the service's HTTP face (its http peer)
        served = await stack.enter_async_context(durability_mode(
            tmp / mode, mode, {"STATEWORKER_HTTP": http}, split_bus=mode == "strict"))
        peers[mode] = await stateworker_peer(served)
        peers[http_name] = await http_peer(served, http)
        if mode == "strict":  # the same writes without the bus: StateStore in this process
            peers["store"] = Peer({"set": served["store"]}, {"redis": served.server.pid or 0},
                                  None)
    peers["strict_x2"], peers["http_x2"] = await replicas_peers(stack, tmp / "x2")
    client = await stack.enter_async_context(etcd_client(etcd and etcd.port))
    if isinstance(client, str) or etcd is None:
        missing["etcd"] = client if isinstance(client, str) else "etcd did not start"
    else:
        peers["etcd"] = await etcd_peer(client, etcd)
    for name, server in (("nats", nats), ("nats_sync", nats_sync)):
        kv = await stack.enter_async_context(nats_kv(server))
        if isinstance(kv, str) or isinstance(server, str):
            missing[name] = kv if isinstance(kv, str) else str(server)
        else:
            peers[name] = await nats_peer(kv, server)
    queue = await stack.enter_async_context(saq_peer(tmp / "saq"))
    if isinstance(queue, str):
        missing["saq"] = queue
    else:
        peers["saq"] = Peer({"set": queue[0]}, queue[1], None)
    return [await _round(peers, seconds, tag) for tag in range(rounds)], missing


def _summary(per_round: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    rows = []
    for row, unit, better_high in _rows():
        values: dict[str, float | None] = {}
        for peer in PEERS:
            seen = [got[row][peer] for got in per_round if peer in got[row]]
            values[peer] = round(statistics.median(seen), 3) if seen else None
        ratios: dict[str, float | None] = {}
        for ours, theirs in PAIRS if better_high is not None else ():
            each = [r for got in per_round
                    if (r := _ratio(row, better_high, ours, theirs, got)) is not None]
            ratios[f"{ours}_vs_{theirs}"] = round(statistics.median(each), 3) if each else None
        rows.append({"measure": row, "unit": unit, "values": values, "ratios": ratios})
    return rows


def _versions() -> dict[str, str]:
    def first_line(args: list[str]) -> str:
        try:
            run = subprocess.run(args, capture_output=True, text=True, check=False)
        except OSError:
            return "not installed"
        return (run.stdout or run.stderr).strip().splitlines()[0] if run.stdout or run.stderr else ""

    binary = nats_binary()
    return {"etcd": first_line(["etcd", "--version"]), "redis": first_line(["redis-server", "-v"]),
            "nats": nats_version(binary) if binary else "not installed"}


def _report(figures: dict[str, Any], out: Any) -> None:
    def cell(value: float | None, fmt: Callable[[float], str]) -> str:
        return "-" if value is None else fmt(value)

    heads = ("sw fast", "sw strict", "http fast", "http strct", "in process", "strict x2",
             "http x2", "etcd", "nats", "nats sync", "saq")
    pair_heads = ("strict/etcd", "strict/nsync", "fast/nats", "http/etcd", "hfast/etcd",
                  "http/strict", "hfast/fast", "fast/saq", "store/etcd", "strictx2/etcd",
                  "httpx2/etcd")
    print(f"\n{'peers (issue 43)':<26}{'unit':>6}" + "".join(f"{h:>11}" for h in heads)
          + "".join(f"{h:>14}" for h in pair_heads), file=out)
    for row in figures["rows"]:
        fmt: Callable[[float], str] = ((lambda v: f"{v:,.0f}") if row["unit"] == "ops/s"
                                       else (lambda v: f"{v:.1f}") if row["unit"] in ("us/op", "%")
                                       else (lambda v: f"{v:.3f}"))
        print(f"{row['measure']:<26}{row['unit']:>6}"
              + "".join(f"{cell(row['values'][p], fmt):>11}" for p in PEERS)
              + "".join(f"{cell(r, lambda v: f'{v:.2f}'):>14}" for r in row["ratios"].values()),
              file=out)
    print("ratios: medians of per-round ratios, >1 = stateworker better (trigger rows: ours "
          "against the peer's watch)", file=out)
    for name, promise in PROMISES.items():
        print(f"  {name:<10}{promise}", file=out)
    for name, why in figures["missing"].items():
        print(f"  {name} not measured: {why}", file=out)
    print(f"versions: {figures['versions']}; load (/proc/loadavg at start): {figures['load']}",
          file=out)
