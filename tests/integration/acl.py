"""What the `acl` mode tests share besides fixtures (tests/integration/bus/conftest.py):
principals and roles made for a test, a principal's client, a call XADDed by hand."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
import redis.asyncio as aredis

from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.core.store import RedisState
from stateworker.state.tenancy import principals
from tests.servers import RedisServer


async def principal(state: RedisState, server: RedisServer, roles: list[str],
                    act_as: tuple[str, ...] = (), name: str | None = None) -> tuple[str, str]:
    """A new principal of `roles`: (its name, its client URL)."""
    name = name or f"p{uuid.uuid4().hex[:10]}"
    password = secrets.token_urlsafe(16)
    await principals.add_principal(state, name, roles, act_as)
    await principals.set_user(state, name, password)
    return name, f"redis://{name}:{password}@127.0.0.1:{server.port}/0"


async def role(state: RedisState, allow: list[str], scopes: list[str],
               services: Sequence[str] = (), read_only: bool = False) -> str:
    """A new role of its own name; the name."""
    name = f"r-{uuid.uuid4().hex[:8]}"
    await principals.add_role(state, name, allow, scopes, read_only, list(services))
    return name


def client_of(url: str, prefix: str, **extra: Any) -> StateClient:
    settings = Settings(redis_url=url, prefix=prefix, partitions=4, auth="acl")
    return StateClient(settings=settings, timeout=20, **extra)


async def raw_call(conn: aredis.Redis, stream: str, reply: str, fn: str, body: dict[str, Any],
                   **fields: str) -> dict[str, Any]:
    """One call XADDed by hand on `conn`; its reply document, popped from `reply`."""
    call_id = uuid.uuid4().hex
    await conn.xadd(stream, {"id": call_id, "fn": fn, "body": msgspec.json.encode(body),
                             "reply": reply, **fields})
    # (BLMPOP: what a principal's Redis user may pop its replies with)
    popped = await conn.execute_command("BLMPOP", 20, 1, reply, "LEFT")
    assert popped is not None, f"no reply to {fn} on {reply}"
    document: dict[str, Any] = msgspec.json.decode(popped[1][0])
    assert document["id"] == call_id
    return document


def credentials(url: str) -> tuple[str, str]:
    """(name, password) of a principal's client URL (`principal`'s)."""
    name, _, password = url.split("//", 1)[1].split("@", 1)[0].partition(":")
    return name, password
