"""The embedded default: a managed redis-server whose data survives close, reopen and kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stateworker import StateStore
from stateworker.errors import ConfigError
from stateworker.state.tenancy import principals
from stateworker.transport.embedded import pid_alive
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def alive(pid: int | None) -> bool:
    return pid_alive(pid)


async def test_write_close_reopen_read(tmp_path: Path) -> None:
    async with StateStore.open(state_dir=str(tmp_path)) as store:
        await store.call_json("state::set", b'{"scope":"s","key":"k","value":{"n":[1.50,{}]}}')
        embedded = store.state.embedded
        assert embedded is not None and embedded.pid is not None
        pid = embedded.pid
        assert embedded.socket.exists()
    assert not alive(pid)  # closed: the managed server is stopped
    assert (tmp_path / "appendonlydir").is_dir()
    async with StateStore.open(state_dir=str(tmp_path)) as store:
        assert await store.call_json("state::get", b'{"scope":"s","key":"k"}') == b'{"n":[1.50,{}]}'
        assert (await store.get_entry("s", "k")).version == 1


async def test_principals_redis_users_survive_a_restart_of_the_embedded_redis(
        tmp_path: Path) -> None:
    """`principal add` saves the ACL (ACL SAVE): the embedded Redis keeps an aclfile."""
    async with StateStore.open(state_dir=str(tmp_path)) as store:
        await principals.add_principal(store.state, "alice", ["reader"], [])
        await principals.set_user(store.state, "alice", "pw")
        assert await principals.save_acl(store.state) is True
    async with StateStore.open(state_dir=str(tmp_path)) as store:
        assert await principals.has_user(store.state, "alice")


async def test_kill_9_of_redis_keeps_acknowledged_writes(tmp_path: Path) -> None:
    async with StateStore.open(state_dir=str(tmp_path), durability="strict") as store:
        for i in range(300):
            await store.set("s", f"k{i}", i)
        embedded = store.state.embedded
        assert embedded is not None and embedded.pid is not None
        os.kill(embedded.pid, signal.SIGKILL)
        if embedded.process is not None:
            embedded.process.wait()
    async with StateStore.open(state_dir=str(tmp_path)) as store:
        assert await store.list("s") == sorted(range(300), key=lambda i: f"k{i}".encode())
        assert len(await store.events("s")) == 300


async def test_a_running_server_is_adopted_not_started_twice(tmp_path: Path) -> None:
    async with StateStore.open(state_dir=str(tmp_path)) as first:
        await first.set("s", "k", 1)
        assert first.state.embedded is not None
        first_pid = first.state.embedded.pid
        # A second process on the same state directory (here: a second store) adopts it.
        async with StateStore.open(state_dir=str(tmp_path)) as second:
            assert second.state.embedded is not None
            assert second.state.embedded.pid == first_pid
            assert await second.get("s", "k") == 1
        # the guest's close leaves the owner's server running
        assert alive(first_pid) and await first.get("s", "k") == 1
    assert not alive(first_pid)


OWNER = """
import anyio, sys
from stateworker import StateStore
async def main():
    async with StateStore.open(state_dir=sys.argv[1], durability="strict") as store:
        await store.set("s", "k", 1)
        print(store.state.embedded.pid, flush=True)
        await anyio.sleep_forever()
anyio.run(main)
"""


async def test_server_of_a_killed_owner_is_adopted_and_owned(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())  # the owner is ready and has written
    owner.kill()  # kill -9: no chance to stop its redis-server
    owner.wait()
    owner.stdout.close()
    assert alive(pid)
    async with StateStore.open(state_dir=str(tmp_path)) as second:
        assert second.state.embedded is not None
        assert second.state.embedded.pid == pid and second.state.embedded.owner
        assert await second.get("s", "k") == 1
    assert not alive(pid)


async def test_external_redis_with_aof_off_is_refused(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "r")
    server.start()
    try:
        with server.client() as client:
            client.config_set("appendonly", "no")
        with pytest.raises(ConfigError, match="AOF off"):
            async with StateStore.open(server.url):
                pass
        async with StateStore.open(server.url, allow_no_aof=True) as store:
            await store.set("s", "k", 1)
            assert await store.get("s", "k") == 1
    finally:
        server.kill()


async def test_partition_count_is_fixed_per_prefix(redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4):
        pass
    with pytest.raises(ConfigError, match="4 partitions"):
        async with StateStore.open(redis_server.url, prefix=prefix, partitions=8):
            pass
