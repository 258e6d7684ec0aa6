"""A PostgreSQL of its own, in a temporary directory on a free port: started by the
benchmarks (`bench_snapshot`) and by the tests' fixtures (tests/servers.py imports it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


POSTGRES_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def postgres_binary(name: str) -> str:
    """initdb / pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name) or next(
        (str(d / name) for d in POSTGRES_BIN_DIRS if (d / name).exists()), None)
    assert found, (f"{name} is not installed (scripts/test and scripts/bench install "
                   "Debian's postgresql)")
    return found


class PostgresServer:
    """One PostgreSQL cluster: initdb in a temporary directory, trust auth, listening on a
    free port on 127.0.0.1 and on a socket directory of its own. Root cannot run initdb or
    postgres: as root, the cluster belongs to `nobody` and the tools run via `runuser`."""

    def __init__(self) -> None:
        # Not under pytest's tmp dirs: those are 0700 root, which `nobody` cannot enter.
        self.root = Path(tempfile.mkdtemp(prefix="sw-postgres-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, args: list[str]) -> None:
        if os.geteuid() == 0:
            args = ["runuser", "-u", "nobody", "--", *args]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       cwd=self.root)

    def init(self) -> None:
        self.sockets.mkdir()
        if os.geteuid() == 0:
            for path in (self.root, self.sockets):
                shutil.chown(path, "nobody")
        self._run([postgres_binary("initdb"), "-D", str(self.data), "-U", "postgres",
                   "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
                   f"-c fsync=off -c max_connections=200")
        self._run([postgres_binary("pg_ctl"), "-D", str(self.data), "-l",
                   str(self.root / "postgres.log"), "-o", options, "-w", "-t", "60", "start"])

    def stop(self) -> None:
        self._run([postgres_binary("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                   "stop"])

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
