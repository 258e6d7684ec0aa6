"""The managed local redis-server used when no Redis URL is configured.

It runs with AOF on, keeps its data under the state directory and listens only on a unix
socket. A server left running by an earlier process that died (its pid file names a live
process and its socket answers) is adopted rather than started twice on the same data. The process that owns
the server (`owner.pid`) stops it on close; an adopter becomes the owner only when the old owner
is gone, so a second store on a live state directory never stops the server under the first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import anyio

from stateworker.errors import ConfigError
from stateworker.settings import Settings
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost, ReplyError

_MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; keep a margin


def _socket_path(state_dir: Path) -> Path:
    path = state_dir / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(str(state_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"stateworker-{digest}.sock"


def _config(state_dir: Path, socket: Path, appendfsync: str) -> str:
    return "\n".join(
        [
            "port 0",
            f"unixsocket {socket}",
            "unixsocketperm 700",
            f"dir {state_dir}",
            f"pidfile {state_dir / 'redis.pid'}",
            f"logfile {state_dir / 'redis.log'}",
            "daemonize no",
            "appendonly yes",
            f"appendfsync {appendfsync}",
            # `acl` mode's principals' users, kept by `ACL SAVE` across restarts
            f"aclfile {state_dir / 'users.acl'}",
            'save ""',
            "",
        ]
    )


def socket_url(state_dir: Path) -> str:
    """The URL of the embedded Redis of a state directory (for clients of a running service)."""
    return f"unix://{_socket_path(state_dir.resolve())}"


def client_url(settings: Settings) -> str:
    """The one URL resolution of every client of a running service (StateClient, Worker, the
    CLI): the configured Redis, else the embedded one of the state directory."""
    return settings.redis_url or socket_url(Path(settings.state_dir))


def bus_url(settings: Settings) -> str:
    """Where the bus is (call streams, reply lists): STATEWORKER_BUS_REDIS_URL, else the
    state's Redis (`client_url`)."""
    return settings.bus_redis_url or client_url(settings)


class EmbeddedRedis:
    """Starts, adopts and stops one redis-server for a state directory."""

    def __init__(self, state_dir: Path, appendfsync: str = "everysec") -> None:
        self.state_dir = state_dir.resolve()
        self.socket = _socket_path(self.state_dir)
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.owner = False  # stop the server on close

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self, timeout_s: float = 15.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if await self._adopt():
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError(
                "redis-server is not installed: install Debian's redis-server package "
                "(apt-get install redis-server) or set STATEWORKER_REDIS_URL"
            )
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        (self.state_dir / "users.acl").touch()  # (Redis refuses an aclfile that is missing)
        conf = self.state_dir / "redis.conf"
        conf.write_text(_config(self.state_dir, self.socket, self.appendfsync))
        # A session of its own, so a Ctrl-C aimed at the service does not kill Redis first.
        self.process = subprocess.Popen(
            [binary, str(conf)], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.pid = self.process.pid
        self._take_ownership()
        with anyio.move_on_after(timeout_s):
            while not await self._answers():
                if self.process.poll() is not None:
                    break
                await anyio.sleep(0.02)  # polling the socket until the server accepts
            else:
                return
        log = self.state_dir / "redis.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        await self.stop()
        raise ConfigError(f"embedded redis-server did not start within {timeout_s}s:\n{tail}")

    async def _adopt(self) -> bool:
        pidfile = self.state_dir / "redis.pid"
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, 0)
        except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
            return False
        if not await self._answers():
            return False
        self.pid = pid
        if not pid_alive(_read_pid(self.state_dir / "owner.pid")):
            self._take_ownership()
        return True

    def _take_ownership(self) -> None:
        self.owner = True
        (self.state_dir / "owner.pid").write_text(str(os.getpid()))

    async def _answers(self) -> bool:
        if not self.socket.exists():
            return False
        conn = RedisConnection(self.url)
        try:
            return bool(await conn.execute("PING") == b"PONG")
        except (ConnectionLost, ReplyError, OSError):
            return False
        finally:
            await conn.close()

    async def stop(self, timeout_s: float = 15.0) -> None:
        """Owner only: SIGTERM (Redis fsyncs the AOF and exits), then wait; SIGKILL at timeout."""
        pid, self.pid = self.pid, None
        if pid is None or not self.owner:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        with anyio.move_on_after(timeout_s):
            while _alive(pid, self.process):
                await anyio.sleep(0.02)  # polling for the process to exit
        if _alive(pid, self.process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()
            self.process = None


def _alive(pid: int, process: subprocess.Popen[bytes] | None) -> bool:
    if process is not None and process.pid == pid:
        return process.poll() is None
    return pid_alive(pid)


def pid_alive(pid: int | None) -> bool:
    """True when `pid` is a running process (a zombie waiting to be reaped counts as gone)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
