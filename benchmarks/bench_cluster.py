"""The `cluster` part of `stateworker bench`: bus `state::set` on a 3+3 Redis Cluster side by
side with one redis-server, in one run, and where the cluster's work lands.

One run starts a single redis-server (AOF everysec, TCP, like the cluster's nodes), a second
one with a replica (as each primary of the cluster has one), and a 3+3 Redis Cluster
(tests/cluster.py), and a `stateworker serve` on each: on the single server once with 1 shard
(the default) and once with 3, on the replicated one and on the cluster (the seed list) with
STATEWORKER_BUS_SHARDS=3, so the ratio to the replicated server's 3 shards isolates the
routing. It measures in alternation (one round of each side, again; medians kept):
- bus `state::set` calls/s at 64 in flight; the cluster's rate as a ratio to each server's;
- the load spread: each primary's share of the commands (INFO commandstats, sum of calls,
  deltas over the cluster's rounds), with the partitions and bus shards each primary holds;
- CPU per call: Redis (INFO cpu used_cpu_user + used_cpu_sys deltas / calls made) on each
  primary and on each server, the replicas, the service (/proc/<pid>/stat) and the clients
  (this process), so docs/scaling.md can project the rate of N primaries and say where a
  cluster's call spends its time;
- last, a failover: kill -9 the primary with the most commands under the same 64-way load
  and time the kill to its replica's promotion and to the first successful call on one of
  its slots; the load's calls that failed meanwhile are counted by code.

Client (this process), four services, three servers and six cluster nodes share the machine's
cores: the figures are ratios, shares and CPU per call, not absolute capacities.
"""

from __future__ import annotations

import importlib
import os
import statistics
import subprocess
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import Op, timed
from benchmarks.pgserver import free_port
from stateworker.bus.client import StateClient
from stateworker.errors import StateError
from stateworker.keys import KeySpace, bus_shard_stream
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot

# tests/cluster.py's RedisCluster (and tests/servers.py's RedisServer) are the project's one way
# to start these servers. Imported by name, not statically: tests/ is not under `mypy --strict`,
# and a static import would pull it into `mypy benchmarks`.
_cluster_module = importlib.import_module("tests.cluster")
_servers_module = importlib.import_module("tests.servers")
RedisCluster: Any = _cluster_module.RedisCluster
RedisServer: Any = _servers_module.RedisServer
wait_until: Any = _servers_module.wait_until
NODE_TIMEOUT_MS: int = _cluster_module.NODE_TIMEOUT_MS

PREFIX = "benchcluster"
SHARDS = 3
PARTITIONS = Settings().partitions
CONCURRENCY = 64
CLIENTS = 4  # each client has its own reply list (one slot): several spread the replies
SCOPES = 512  # many scopes: every partition, so every primary, gets calls
SPREAD_BOUNDS = (0.25, 0.42)  # the share of the commands each of 3 primaries should run
FAILOVER_TIMEOUT_S = 60.0
REPLICA_SYNC_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 45.0  # above the service's 30 s heal_within_s: a failover is ridden out


@dataclass
class Side:
    """One service under measurement and the Redis processes whose counters it moves."""

    name: str
    url: str
    shards: int
    ports: list[int]
    clients: list[StateClient] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    calls: int = 0
    commands: Counter[int] = field(default_factory=Counter)  # port -> commands run
    cpu_s: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # port -> CPU s
    replica_ports: list[int] = field(default_factory=list)
    replicas_cpu_s: float = 0.0  # CPU seconds the replicas used (the cluster's)
    service_pid: int = 0
    service_cpu_s: float = 0.0  # the `stateworker serve` process's CPU seconds
    client_cpu_s: float = 0.0  # this process's (the clients') CPU seconds


def _counters(port: int) -> tuple[int, float]:
    """(commands run, CPU seconds used) by the redis-server on `port` so far. Commands a
    script or function runs are counted as well as the script's own call."""
    with redis.Redis(port=port, socket_timeout=5) as client:
        stats, cpu = client.info("commandstats"), client.info("cpu")
    commands = sum(int(row["calls"]) for row in stats.values())
    return commands, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _setter(side: Side) -> Op:
    value = b'{"n":1,"name":"bench","tags":["a","b"],"ok":true}'

    async def op(w: int, i: int) -> Any:
        scope = (w + CONCURRENCY * i) % SCOPES  # each worker walks through the scopes
        client = side.clients[w % len(side.clients)]
        return await client.call_json(
            "state::set", b'{"scope":"s%d","key":"k%d","value":%s}' % (scope, w, value))
    return op


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux: /proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round(side: Side, seconds: float) -> None:
    before = {port: _counters(port) for port in side.ports}
    replicas_before = sum(_counters(port)[1] for port in side.replica_ports)
    service_before, client_before = _process_cpu_s(side.service_pid), time.process_time()
    rate, latencies = await timed(_setter(side), CONCURRENCY, seconds)
    side.client_cpu_s += time.process_time() - client_before
    side.service_cpu_s += _process_cpu_s(side.service_pid) - service_before
    after = {port: _counters(port) for port in side.ports}
    replicas_after = sum(_counters(port)[1] for port in side.replica_ports)
    side.replicas_cpu_s += replicas_after - replicas_before
    side.rates.append(rate)
    side.calls += len(latencies)
    for port in side.ports:
        side.commands[port] += after[port][0] - before[port][0]
        side.cpu_s[port] += after[port][1] - before[port][1]


class Replica:
    """A replica of one redis-server, set up as the cluster's replicas are (AOF everysec): the
    baseline that keeps a copy of every write, as the cluster does, without the routing."""

    def __init__(self, directory: Path, primary_port: int) -> None:
        self.directory = directory
        self.primary_port = primary_port
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--replicaof", "127.0.0.1", str(self.primary_port),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--repl-diskless-sync-delay", "0", "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._in_sync, REPLICA_SYNC_TIMEOUT_S, f"the replica on port {self.port} to sync")

    def _in_sync(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_timeout=1) as client:
                return bool(client.info("replication").get("master_link_status") == "up")
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=15)


@dataclass
class Servers:
    single: Any  # RedisServer: the 1- and 3-shard services' Redis
    replicated: Any  # RedisServer with `replica`: the 3-shard service that keeps a copy
    replica: Replica
    cluster: Any  # RedisCluster


@asynccontextmanager
async def _servers() -> AsyncIterator[Servers]:
    with tempfile.TemporaryDirectory(prefix="sw-bench-cluster-") as tmp:
        replicated = RedisServer(Path(tmp) / "replicated")
        servers = Servers(RedisServer(Path(tmp) / "one"), replicated,
                          Replica(Path(tmp) / "replica", replicated.port),
                          RedisCluster(Path(tmp) / "cluster"))
        try:
            for server in (servers.single, servers.replicated, servers.replica, servers.cluster):
                server.start()
            yield servers
        finally:
            for server in (servers.cluster, servers.replica, servers.replicated, servers.single):
                server.kill()


async def cluster_section(seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    async with _servers() as servers:
        single, replicated, cluster = servers.single, servers.replicated, servers.cluster
        primaries = sorted(node.port for node in cluster.primaries())
        sides = [Side("one_1_shard", single.url, 1, [single.port]),
                 Side("one_3_shards", single.url, SHARDS, [single.port]),
                 Side("one_3_shards_replica", replicated.url, SHARDS, [replicated.port],
                      replica_ports=[servers.replica.port]),
                 Side("cluster_3_shards", cluster.urls, SHARDS, primaries,
                      replica_ports=[node.port for node in cluster.replicas()])]
        services: list[subprocess.Popen[str]] = []
        try:
            async with AsyncExitStack() as stack:
                for side in sides:
                    prefix = f"{PREFIX}{side.shards}"
                    services.append(start_service(
                        side.url, prefix, env={"STATEWORKER_BUS_SHARDS": str(side.shards)}))
                    side.service_pid = services[-1].pid
                    settings = Settings(redis_url=side.url, prefix=prefix, bus_shards=side.shards)
                    for _ in range(CLIENTS):
                        side.clients.append(await stack.enter_async_context(
                            StateClient(settings=settings, timeout=CALL_TIMEOUT_S)))
                    for w in range(CONCURRENCY):  # warm up: scripts loaded, every scope once
                        for i in range(SCOPES // CONCURRENCY):
                            await _setter(side)(w, i)
                for _ in range(rounds):
                    for side in sides:
                        await _round(side, seconds)
                figures = _figures(sides, cluster, out)
                figures["failover"] = await _failover(sides[-1], cluster, out)
                return figures
        finally:
            for service in services:
                service.terminate()
                service.wait(timeout=30)


def _figures(sides: list[Side], cluster: Any, out: Any) -> dict[str, Any]:
    by_name = {side.name: side for side in sides}
    on_cluster = by_name["cluster_3_shards"]
    figures: dict[str, Any] = {
        side.name: {"calls_per_s": round(statistics.median(side.rates)),
                    "service_cpu_us_per_call": round(side.service_cpu_s / side.calls * 1e6),
                    "client_cpu_us_per_call": round(side.client_cpu_s / side.calls * 1e6),
                    "redis_commands_per_call": round(sum(side.commands.values()) / side.calls, 2),
                    "replicas_cpu_us_per_call": round(side.replicas_cpu_s / side.calls * 1e6, 1),
                    "redis_cpu_us_per_call": {str(port): round(side.cpu_s[port] / side.calls * 1e6, 1)
                                              for port in side.ports}}
        for side in sides}
    cluster_rate = statistics.median(on_cluster.rates)
    figures["ratios"] = {
        f"cluster_vs_{name}_at_64": round(cluster_rate / statistics.median(by_name[name].rates), 3)
        for name in ("one_3_shards", "one_1_shard", "one_3_shards_replica")}
    total = sum(on_cluster.commands.values())
    shares = {port: on_cluster.commands[port] / total for port in on_cluster.ports}
    layout = _layout(cluster)
    figures["spread"] = {
        str(port): {"share": round(shares[port], 3),
                    "commands_per_call": round(on_cluster.commands[port] / on_cluster.calls, 2),
                    **layout.get(port, {})}
        for port in on_cluster.ports}
    low, high = SPREAD_BOUNDS
    figures["spread_holds"] = all(low <= share <= high for share in shares.values())
    figures["cluster_cpu_us_per_call"] = round(
        sum(on_cluster.cpu_s.values()) / on_cluster.calls * 1e6, 1)
    busiest = max(on_cluster.cpu_s.values()) / on_cluster.calls
    figures["projected_calls_per_s_at_one_core_per_busiest_primary"] = round(1 / busiest)
    _report(figures, sides, out)
    return figures


def _layout(cluster: Any) -> dict[int, dict[str, list[str]]]:
    """Per primary: the partitions (p<i>) and bus shard streams (b<i>) whose slots it serves."""
    keys = KeySpace(f"{PREFIX}{SHARDS}", PARTITIONS)
    layout: dict[int, dict[str, list[str]]] = {}
    for n in range(PARTITIONS):
        port = cluster.owner(key_slot(f"{{{keys.prefix}:p{n}}}")).port
        layout.setdefault(port, {"partitions": [], "shards": []})["partitions"].append(f"p{n}")
    for n in range(SHARDS):
        port = cluster.owner(key_slot(bus_shard_stream(keys.prefix, "state", n))).port
        layout.setdefault(port, {"partitions": [], "shards": []})["shards"].append(f"b{n}")
    return layout


def _report(figures: dict[str, Any], sides: list[Side], out: Any) -> None:
    print(f"\n{'bus state::set, 64 in flight':<24}{'calls/s':>9}{'cmds/call':>11}"
          f"{'CPU us/call: redis':>20}{'replicas':>10}{'service':>9}{'client':>8}", file=out)
    for side in sides:
        row = figures[side.name]
        redis_cpu = sum(row["redis_cpu_us_per_call"].values())
        print(f"{side.name:<24}{row['calls_per_s']:>9,}{row['redis_commands_per_call']:>11.2f}"
              f"{redis_cpu:>20.1f}{row['replicas_cpu_us_per_call']:>10.1f}"
              f"{row['service_cpu_us_per_call']:>9}{row['client_cpu_us_per_call']:>8}", file=out)
    for name, ratio in figures["ratios"].items():
        print(f"{name:<44}{ratio:>6.2f}", file=out)
    print(f"\n{'primary':<10}{'share':>8}{'cmds/call':>11}{'cpu us/call':>13}  holds", file=out)
    cpu = figures["cluster_3_shards"]["redis_cpu_us_per_call"]
    for port, row in figures["spread"].items():
        holds = " ".join(row.get("partitions", []) + row.get("shards", []))
        print(f"{port:<10}{row['share']:>8.1%}{row['commands_per_call']:>11.2f}{cpu[port]:>13.1f}"
              f"  {holds}", file=out)
    low, high = SPREAD_BOUNDS
    print(f"load spread {low:.0%}..{high:.0%} per primary: "
          f"{'holds' if figures['spread_holds'] else 'does NOT hold'}", file=out)


async def _failover(side: Side, cluster: Any, out: Any) -> dict[str, Any]:
    """kill -9 the busiest primary under the 64-way load: seconds to its replica's promotion
    and to the first call on one of its partitions that succeeds; the load's failures."""
    victim = max(side.ports, key=lambda port: side.commands[port])
    keys = KeySpace(f"{PREFIX}{SHARDS}", PARTITIONS)
    probe_scope = next(f"s{n}" for n in range(SCOPES)
                       if cluster.owner_port(key_slot(keys.for_scope(f"s{n}").tag)) == victim)
    slot = key_slot(keys.for_scope(probe_scope).tag)
    errors: Counter[str] = Counter()
    done = [0]
    longest = [0.0]
    marks: dict[str, float] = {}
    setter = _setter(side)

    async def loader(w: int) -> None:
        i = 0
        while "probe_ok" not in marks or time.perf_counter() < marks["probe_ok"] + 1.0:
            start = time.perf_counter()
            try:
                await setter(w, i)
                done[0] += 1
            except StateError as exc:
                errors[exc.code] += 1
            longest[0] = max(longest[0], time.perf_counter() - start)
            i += 1

    async def probe() -> None:
        client = side.clients[0]
        while "probe_ok" not in marks:
            try:
                await client.call_json("state::set", b'{"scope":"%s","key":"probe","value":1}'
                                       % probe_scope.encode())
                marks["probe_ok"] = time.perf_counter()
            except StateError as exc:
                errors["probe " + exc.code] += 1

    def promoted() -> None:
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while cluster.owner_port(slot) in (None, victim) and time.monotonic() < deadline:
            time.sleep(0.01)  # (a bench's bounded poll of another process's state)
        marks["promoted"] = time.perf_counter()

    with anyio.fail_after(FAILOVER_TIMEOUT_S * 2):
        async with anyio.create_task_group() as tg:
            for w in range(CONCURRENCY):
                tg.start_soon(loader, w)
            await anyio.sleep(1.0)  # (the load runs before the kill)
            marks["kill"] = time.perf_counter()
            cluster.kill_node(victim)
            tg.start_soon(probe)
            await anyio.to_thread.run_sync(promoted)
    result = {"victim_port": victim, "node_timeout_ms": NODE_TIMEOUT_MS,
              "kill_to_promoted_s": round(marks["promoted"] - marks["kill"], 2),
              "kill_to_first_call_s": round(marks["probe_ok"] - marks["kill"], 2),
              "load_calls_ok": done[0], "failed_by_code": dict(errors),
              "longest_call_s": round(longest[0], 2)}
    _report_failover(result, out)
    return result


def _report_failover(result: dict[str, Any], out: Any) -> None:
    print(f"\nfailover (kill -9 of primary {result['victim_port']}, cluster-node-timeout "
          f"{result['node_timeout_ms']} ms): promoted after {result['kill_to_promoted_s']} s, "
          f"first call on its slot after {result['kill_to_first_call_s']} s; load: "
          f"{result['load_calls_ok']} calls ok, failed {result['failed_by_code'] or 'none'}, "
          f"longest call {result['longest_call_s']} s", file=out)
