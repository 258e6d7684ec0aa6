"""state::delete-barrier through every door (the bus, the HTTP face, the CLI) in `acl` mode:
roles decide who may (a grant of it on `*`, as for state::barrier: a barrier names no
scope), and a principal's barrier ids are its own, `<principal>/<id>`, so it deletes only
barriers it arrived at. A Redis of the module's own: ACL users are server-wide."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from stateworker import StateError
from stateworker.app.service import StateService
from tests.integration.acl import client_of, credentials, principal, role
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def over_bus(url: str, prefix: str, fn: str, body: dict[str, Any]) -> dict[str, Any]:
    async with client_of(url, prefix) as client:
        try:
            return {"ok": True, "result": await client.call(fn, body)}
        except StateError as exc:
            return {"ok": False, "error": exc.to_dict()}


async def over_http(base: str, url: str, fn: str, body: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, auth=credentials(url)) as client:
        answer = await client.post(f"/v1/call/{fn}", content=msgspec.json.encode(body))
    document: dict[str, Any] = answer.json()
    return document


async def over_cli(url: str, prefix: str, barrier_id: str) -> dict[str, Any]:
    """`stateworker delete-barrier` as the principal (in a thread: the service serves it in
    this process's event loop meanwhile)."""
    done = await anyio.to_thread.run_sync(functools.partial(
        subprocess.run,
        [sys.executable, "-m", "stateworker", "--redis-url", url, "delete-barrier", barrier_id],
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
             "STATEWORKER_AUTH": "acl"}, capture_output=True, text=True, timeout=60))
    if done.returncode == 0:
        return {"ok": True, "result": msgspec.json.decode(done.stdout)}
    return {"ok": False, "error": msgspec.json.decode(done.stderr.strip().splitlines()[-1])}


async def test_delete_barrier_honours_roles_and_ownership_at_every_door(
        acl_served: StateService, acl_redis: RedisServer, prefix: str) -> None:
    everywhere = await role(acl_served.state, ["read", "write"], ["*"])
    reading = await role(acl_served.state, ["read"], ["*"])
    narrow = await role(acl_served.state, ["read", "write"], ["orders"])
    _, alice = await principal(acl_served.state, acl_redis, [everywhere])
    _, bob = await principal(acl_served.state, acl_redis, [everywhere])
    _, reader = await principal(acl_served.state, acl_redis, [reading])
    _, orders = await principal(acl_served.state, acl_redis, [narrow])
    base = f"http://{acl_served.http_address}"

    async def arrive(url: str, barrier_id: str) -> None:
        done = await over_bus(url, prefix, "state::barrier", {
            "event": {"key": "a"}, "condition_config": {"id": barrier_id, "expect": 2}})
        assert done["ok"], done

    doors = {
        "bus": lambda url, i: over_bus(url, prefix, "state::delete-barrier", {"id": i}),
        "http": lambda url, i: over_http(base, url, "state::delete-barrier", {"id": i}),
        "cli": lambda url, i: over_cli(url, prefix, i),
    }
    for door, delete in doors.items():
        barrier_id = f"gate-{door}"
        await arrive(alice, barrier_id)
        await arrive(bob, barrier_id)  # bob's own barrier of that name: `<bob>/gate-…`
        for who in (reader, orders):  # no write grant on `*`: refused, nothing deleted
            denied = await delete(who, barrier_id)
            assert not denied["ok"] and denied["error"]["code"] == "PERMISSION_DENIED", \
                (door, denied)
        done = await delete(alice, barrier_id)
        assert done["ok"] and done["result"] == {"deleted": True}, (door, done)
        assert (await delete(alice, barrier_id))["result"] == {"deleted": False}, door
        # bob's barrier of the same name is untouched: his arrival still counts there.
        second = await over_bus(bob, prefix, "state::barrier", {
            "event": {"key": "b"}, "condition_config": {"id": barrier_id, "expect": 2}})
        assert second["result"]["decision"] == "allow", (door, second)
