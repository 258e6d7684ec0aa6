"""Real servers for the tests: a redis-server in a temporary directory on a free port."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class ServiceProcess:
    """`stateworker serve` in a process of its own, for crash and signal tests."""

    def __init__(self, redis_url: str, prefix: str, consumer: str = "svc-1",
                 visibility_timeout_ms: int = 1000) -> None:
        self.args = [sys.executable, "-m", "stateworker", "--redis-url", redis_url, "serve",
                     "--consumer", consumer, "--visibility-timeout-ms", str(visibility_timeout_ms),
                     "--log-level", "WARNING"]
        self.env = {**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"}
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.args, env=self.env, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        assert ready, "the service did not report that it serves within 30 s"
        line = self.process.stdout.readline()
        assert '"serving"' in line, line

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
            self.signal(signal.SIGKILL)
            self.wait()
