"""A real Redis Cluster for the tests: 6 redis-server processes (3 primaries, 3 replicas), each
with AOF on in a temporary directory of its own on a free port, joined by
`redis-cli --cluster create ... --cluster-replicas 1`.

`start()` returns once every node reports `cluster_state:ok` and all 16384 slots are served
(polled with a bounded timeout). `primaries()` / `replicas()` read the topology as the cluster
sees it now (CLUSTER SHARDS), with each node's pid, so a failover test can kill -9 a primary
and wait for its replica to be promoted.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.servers import free_port, wait_until

NODES = 6
NODE_TIMEOUT_MS = 2000  # a dead primary is failed over in ~2-4 s
SLOTS = 16384


@dataclass(frozen=True)
class ClusterNode:
    """One node as the cluster sees it now."""

    port: int
    pid: int
    role: str  # "primary" / "replica"
    slots: tuple[tuple[int, int], ...]  # the slot ranges its shard serves (inclusive)
    node_id: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def holds(self, slot: int) -> bool:
        return any(lo <= slot <= hi for lo, hi in self.slots)


class RedisCluster:
    """6 redis-server processes in cluster mode, 3 primaries with a replica each."""

    def __init__(self, directory: Path, nodes: int = NODES, appendfsync: str = "everysec") -> None:
        self.directory = directory
        self.appendfsync = appendfsync  # "always": a cluster of its own for durability strict
        self.ports: list[int] = []
        self.bus_ports: dict[int, int] = {}
        self.ports = self._fresh(nodes)
        # (each bus port is a free port of its own, kept across a restart: port + 10000, the
        # default, may be past 65535)
        self.bus_ports = dict(zip(self.ports, self._fresh(nodes), strict=True))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def urls(self) -> str:
        """The seed list: every node, comma-separated (STATEWORKER_REDIS_URL's form)."""
        return ",".join(f"redis://127.0.0.1:{port}" for port in self.ports)

    @property
    def url(self) -> str:
        """One node (the first started; a primary at creation, maybe not after a failover)."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> None:
        binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        assert binary and cli, "redis-server / redis-cli are not installed (scripts/test installs them)"
        for port in self.ports:
            self._start_node(binary, port)
        for _attempt in range(3):  # (a free port may be taken before the node binds it)
            for port in self.ports:
                wait_until(lambda p=port: _answers(p) or self.processes[p].poll() is not None,
                           15, f"cluster node on port {port}")
            dead = [port for port in self.ports if self.processes[port].poll() is not None]
            if not dead:
                break
            for port in dead:  # new ports for it (no cluster is formed yet: nothing knows them)
                del self.processes[port], self.bus_ports[port]
                new, bus = self._fresh(2)
                self.ports[self.ports.index(port)] = new
                self.bus_ports[new] = bus
                self._start_node(binary, new)
        else:
            raise AssertionError(f"cluster nodes would not start: {dead}")
        subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        self.wait_healthy()

    def _fresh(self, count: int) -> list[int]:
        """`count` free ports, none of them one this cluster's nodes use already: the kernel
        may hand out a port twice while nothing binds it, and two nodes (or a node and
        another's cluster bus) on one port would leave one dead."""
        taken = set(self.ports) | set(self.bus_ports.values())
        ports: list[int] = []
        while len(ports) < count:
            port = free_port()
            if port not in taken:
                taken.add(port)
                ports.append(port)
        return ports

    def _start_node(self, binary: str, port: int) -> None:
        directory = self.directory / str(port)
        directory.mkdir(parents=True, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
             "--cluster-enabled", "yes", "--cluster-port", str(self.bus_ports[port]),
             "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "yes",
             "--appendfsync", self.appendfsync, "--save", "", "--repl-diskless-sync-delay", "0",
             # (a replica shows as online once its offset moves: ping it every second)
             "--repl-ping-replica-period", "1",
             "--logfile", str(directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def alive_ports(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok with all slots served and is online; 3 primaries."""
        for port in self.alive_ports():
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    info = client.execute_command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or f"cluster_slots_ok:{SLOTS}" not in text:
                return False
        nodes = self.nodes()  # every live node online (a replica in sync), 3 primaries
        return (len(nodes) == len(self.alive_ports())
                and len([n for n in nodes if n.role == "primary"]) == len(self.ports) // 2)

    def wait_healthy(self, timeout_s: float = 30) -> None:
        wait_until(self.healthy, timeout_s, "the Redis Cluster to be ok with every slot served")

    def nodes(self) -> list[ClusterNode]:
        """The topology now (CLUSTER SHARDS of a live node): live nodes only."""
        for port in self.alive_ports():
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    shards = client.execute_command("CLUSTER", "SHARDS")
            except redis.RedisError:
                continue
            found = []
            for shard in shards:
                shard = _pairs(shard)
                flat = shard[b"slots"]
                ranges = tuple((int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))
                for node in shard[b"nodes"]:
                    node = _pairs(node)
                    node_port = int(node[b"port"])
                    process = self.processes.get(node_port)
                    if node[b"health"] != b"online" or process is None or process.poll() is not None:
                        continue
                    role = "primary" if node[b"role"] == b"master" else "replica"
                    found.append(ClusterNode(node_port, process.pid, role, ranges,
                                             node[b"id"].decode()))
            return found
        return []

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.nodes() if n.role == "primary"]

    def replicas(self) -> list[ClusterNode]:
        return [n for n in self.nodes() if n.role == "replica"]

    def owner(self, slot: int) -> ClusterNode:
        """The primary serving `slot` now (AssertionError: none, a failover under way)."""
        found = self.owner_port(slot)
        assert found is not None, f"no live primary serves slot {slot}"
        return next(n for n in self.primaries() if n.port == found)

    def owner_port(self, slot: int) -> int | None:
        """The port of the live primary serving `slot` now; None when none does."""
        return next((n.port for n in self.primaries() if n.holds(slot)), None)

    def promoted(self, slot: int, dead_port: int, timeout_s: float = 30) -> int:
        """Once the primary on `dead_port` was killed: wait until a live primary serves `slot`
        (its replica promoted) and return that primary's port."""
        wait_until(lambda: self.owner_port(slot) not in (None, dead_port), timeout_s,
                   f"a replica promoted to serve slot {slot}")
        port = self.owner_port(slot)
        assert port is not None
        return port

    def move_slot(self, slot: int, to_port: int, keys_per_step: int = 1) -> int:
        """Move `slot` to the primary on `to_port` as `redis-cli --cluster reshard` does:
        IMPORTING / MIGRATING, MIGRATE its keys `keys_per_step` at a time (calls meanwhile
        meet ASK and TRYAGAIN), then SETSLOT NODE on every primary (calls then meet MOVED).
        Returns how many keys moved."""
        source = self.owner(slot)
        target = next(n for n in self.primaries() if n.port == to_port)
        assert source.port != target.port
        moved = 0
        with self.client(source.port) as src, self.client(target.port) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.node_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, keys_per_step)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
            for node in self.primaries():
                with self.client(node.port) as each:
                    each.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.node_id)
        wait_until(lambda: self.owner(slot).port == to_port, 15, f"slot {slot} to move")
        return moved

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port)

    def kill_node(self, port: int, sig: int = signal.SIGKILL) -> None:
        """kill -9 one node (a primary: its replica is promoted after NODE_TIMEOUT_MS)."""
        process = self.processes[port]
        process.send_signal(sig)
        process.wait(timeout=15)

    def restart_node(self, port: int) -> None:
        """Start a killed node again on its data: it rejoins, as a replica of the primary
        promoted in its place; returns once the cluster is healthy again."""
        binary = shutil.which("redis-server")
        assert binary
        self._start_node(binary, port)
        wait_until(lambda: _answers(port), 15, f"cluster node on port {port}")
        self.wait_healthy()

    def kill(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=15)


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_timeout=1) as client:
            return bool(client.ping())
    except redis.ConnectionError:
        return False


def _pairs(flat: object) -> dict[bytes, object]:
    """A RESP2 map (a flat list of name, value ...) as a dict; redis-py may give a dict."""
    if isinstance(flat, dict):
        return {k if isinstance(k, bytes) else str(k).encode(): v for k, v in flat.items()}
    items = list(flat)  # type: ignore[call-overload]
    return dict(zip(items[::2], items[1::2], strict=True))
