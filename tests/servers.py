"""Real servers for the tests: a redis-server, and a PostgreSQL, each in a temporary directory
on a free port (the PostgreSQL is benchmarks/pgserver.py's, which the benchmarks start too)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import redis

from benchmarks.pgserver import PostgresServer, free_port

__all__ = ["BUSY_SCRIPT", "FaultProxy", "PostgresServer", "RedisServer", "ServiceProcess",
           "free_port", "frozen", "skewed", "tcp_quiet", "wait_until"]


def wait_until(condition: object, timeout_s: float, what: str) -> None:
    """Poll `condition()` until it is true; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


class RedisServer:
    """One redis-server process with AOF on, data in `directory`."""

    def __init__(self, directory: Path, appendfsync: str = "everysec") -> None:
        self.directory = directory
        self.appendfsync = appendfsync
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (scripts/test installs it)"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "",
             # (a replica's sync starts at once, not after 5 s waiting for more replicas)
             "--repl-diskless-sync-delay", "0",
             "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self.answers, 15, f"redis-server on port {self.port}")

    def answers(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_timeout=1) as client:
                return bool(client.ping())
        except redis.ConnectionError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=15)
            self.process = None


# Keeps the server busy running a script for ARGV[1] ms (EVAL BUSY_SCRIPT 0 <ms>).
BUSY_SCRIPT = """local function now() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local stop = now() + tonumber(ARGV[1]) * 1000
while now() < stop do end
return 1"""


@contextlib.contextmanager
def primary_with_replica(directory: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """Two redis-servers (`appendfsync always`), the second a replica of the first, in sync."""
    primary = RedisServer(directory / "primary", appendfsync="always")
    replica = RedisServer(directory / "replica", appendfsync="always")
    try:
        primary.start()
        replica.start()
        replica.client().execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
        wait_until(lambda: replica.client().info("replication").get(
            "master_link_status") == "up", 15, "the replica in sync")
        yield primary, replica
    finally:
        primary.kill()
        replica.kill()


def frozen(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP): its state in /proc is `T`."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def tcp_quiet(port: int) -> bool:
    """No request in flight to the server on `port` on this host (/proc/net/tcp): no client
    socket holds unsent bytes for it and none of its sockets holds unread ones, so the server
    has read - and, for Redis, run - every command sent to it so far. (Replies waiting for a
    client that does not read, a stopped one, do not count.)"""
    with open("/proc/net/tcp") as table:
        rows = table.read().splitlines()[1:]
    for row in rows:
        fields = row.split()
        local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
        tx, rx = (int(part, 16) for part in fields[4].split(":"))
        if (local == port and rx) or (remote == port and tx):
            return False
    return True


def skewed(offset_s: float) -> dict[str, str]:
    """The environment that runs a process with its clock `offset_s` off (Debian's faketime,
    libfaketime preloaded: as a VM resumed, or a clock NTP never corrected), checked on a
    Python started with it. Preloaded rather than the
    `faketime` command, which forks: a kill of it would leave the process running."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    assert found, "faketime is not installed (scripts/test installs it: apt-get install faketime)"
    env = {"LD_PRELOAD": str(found[0]), "FAKETIME": f"{offset_s:+g}s"}
    shown = subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                           env={**os.environ, **env}, capture_output=True, text=True,
                           check=True, timeout=30)
    off = float(shown.stdout) - time.time()
    assert abs(off - offset_s) < 5, f"faketime shifted the clock by {off:.1f} s, not {offset_s}"
    return env


class ServiceProcess:
    """`stateworker serve` in a process of its own, for crash and signal tests."""

    def __init__(self, redis_url: str, prefix: str, consumer: str = "svc-1",
                 visibility_timeout_ms: int = 1000, env: dict[str, str] | None = None,
                 files: int | None = None) -> None:
        """`files`: the process's open-file limit (`ulimit -n`, soft and hard), if not ours."""
        self.args = [sys.executable, "-m", "stateworker", "--redis-url", redis_url, "serve",
                     "--consumer", consumer, "--visibility-timeout-ms", str(visibility_timeout_ms),
                     "--log-level", "WARNING"]
        self.env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
                    **(env or {})}
        self.files = files
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        files = self.files

        def limited() -> None:  # (in the child, before it runs the service)
            if files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

        self.process = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True,
                                        preexec_fn=limited if files is not None else None)
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        assert ready, "the service did not report that it serves within 30 s"
        line = self.process.stdout.readline()
        assert '"serving"' in line, line
        self.started: dict[str, Any] = json.loads(line)  # (the start line: where it serves)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        assert self.process is not None
        code = self.process.wait(timeout=timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None
        return code

    def kill(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGKILL)  # (a stopped process too, without running again)
            self.wait()

    def freeze(self) -> None:
        """SIGSTOP, and wait until the process is stopped: it sends nothing more."""
        assert self.process is not None
        self.signal(signal.SIGSTOP)
        pid = self.process.pid
        wait_until(lambda: frozen(pid), 10, f"process {pid} to stop")

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)


class FaultProxy:
    """A TCP proxy in front of a real Redis that injects one fault into the connection whose
    requests first show `marker` (bytes):

    - `hold`: that request and every later one on the connection are kept, not sent, until
      `release()` sends them in order: a client whose call is still in flight, for as long as
      the test says.
    - `mute`: requests go on to Redis (the commands run), but no reply comes back from then
      on, until `cut()` closes the connection: Redis lost in the middle of a batch, after the
      commands ran.
    - `late`: requests go on to Redis (the commands run), their replies are kept from then on
      until `release()` sends them in order: a client that waits for an answer Redis gave
      already, while the test changes something under it.

    Other connections, and new ones after the fault, pass untouched. Run it with
    `await task_group.start(proxy.serve)`; clients connect to `proxy.url`.
    """

    OVERLAP = 1024  # request bytes kept from the previous chunk: a marker split in two is seen

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.mode: str | None = None
        self.marker = b""
        self.triggered = anyio.Event()  # set when a connection showed the marker
        self.held_bytes = 0
        self._victim: _Link | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, mode: str, marker: bytes) -> None:
        assert mode in ("hold", "mute", "late") and self._victim is None
        self.mode, self.marker = mode, marker

    async def release(self) -> None:
        """Send what a `hold` (or a `late`) kept, and forward normally from then on."""
        link = self._victim
        assert link is not None and self.mode in ("hold", "late")
        async with link.lock:
            if link.kept:
                await (link.upstream if self.mode == "hold" else link.client).send(
                    b"".join(link.kept))
            link.kept.clear()
            link.holding = link.late = False

    def cut(self) -> None:
        """Close the muted connection (both sides)."""
        assert self._victim is not None and self.mode == "mute"
        self._victim.scope.cancel()

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", self.upstream_port) as upstream, \
                anyio.create_task_group() as tg:
            link = _Link(upstream, client, tg.cancel_scope)
            tg.start_soon(self._requests, client, link)
            tg.start_soon(self._replies, upstream, client, link)

    async def _requests(self, client: anyio.abc.SocketStream, link: _Link) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async for chunk in client:
                seen, link.tail = link.tail + chunk, (link.tail + chunk)[-self.OVERLAP:]
                if self.mode and self._victim is None and self.marker in seen:
                    self._victim = link
                    link.holding = self.mode == "hold"
                    link.muted = self.mode == "mute"
                    link.late = self.mode == "late"
                    self.triggered.set()
                async with link.lock:
                    if link.holding:
                        link.kept.append(chunk)
                        self.held_bytes += len(chunk)
                    else:
                        await link.upstream.send(chunk)
        link.scope.cancel()

    async def _replies(self, upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream,
                       link: _Link) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            async for chunk in upstream:
                async with link.lock:
                    if link.late:
                        link.kept.append(chunk)
                        self.held_bytes += len(chunk)
                    elif not link.muted:
                        await client.send(chunk)
        link.scope.cancel()


class _Link:
    """One proxied connection."""

    def __init__(self, upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream,
                 scope: anyio.CancelScope) -> None:
        self.upstream = upstream
        self.client = client
        self.scope = scope
        self.lock = anyio.Lock()
        self.tail = b""
        self.holding = False
        self.muted = False
        self.late = False
        self.kept: list[bytes] = []  # (requests a `hold` keeps, or replies a `late` keeps)
