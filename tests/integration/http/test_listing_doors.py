"""`acl` mode: state::list_entries' share of a partition's snapshots is the principal's, the same
through the HTTP call API and the bus. A principal flooding a partition with listings over both
doors recycles its own share only (and may not name another principal as its bus `caller`): the other
principal's listing, begun on the bus and read on over HTTP, goes on, and it starts new ones.
A Redis of the module's own: ACL users are server-wide."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.keys import principal_reply_prefix, principal_stream
from stateworker.state.kv import pages
from tests.integration.acl import credentials, principal, role
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
FN = "state::list_entries"


async def over_http(service: StateService, url: str, body: dict[str, Any], fn: str = FN
                    ) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}",
                                 auth=credentials(url)) as client:
        answer = await client.post(f"/v1/call/{fn}", content=msgspec.json.encode(body))
    document: dict[str, Any] = answer.json()
    return document


async def over_bus(prefix: str, url: str, body: dict[str, Any], **fields: str
                   ) -> dict[str, Any]:
    name = credentials(url)[0]
    reply = principal_reply_prefix(prefix, name) + uuid.uuid4().hex[:8]
    conn = aredis.Redis.from_url(url)
    try:
        await conn.xadd(principal_stream(prefix, "state", name), {
            "id": uuid.uuid4().hex, "fn": FN, "reply": reply,
            "body": msgspec.json.encode(body), **fields})
        popped = await conn.execute_command("BLMPOP", 20, 1, reply, "LEFT")
    finally:
        await conn.aclose()
    assert popped is not None, "no reply"
    document: dict[str, Any] = msgspec.json.decode(popped[1][0])
    return document


async def test_a_principals_share_is_its_own_through_every_door(
        acl_served: StateService, acl_redis: RedisServer, prefix: str) -> None:
    keys = acl_served.state.keys
    victim_scope = f"listing-{uuid.uuid4().hex[:8]}"
    tag = keys.for_scope(victim_scope).tag
    flood_scope = next(s for i in range(10_000) if keys.for_scope(s := f"flood-{i}").tag == tag)
    reader = await role(acl_served.state, ["read", "write"], ["listing-*", "flood-*"])
    victim_name, victim = await principal(acl_served.state, acl_redis, [reader])
    _, flooder = await principal(acl_served.state, acl_redis, [reader])
    for scope in (victim_scope, flood_scope):
        for key in ("a", "b"):
            written = await over_http(acl_served, victim, {"scope": scope, "key": key,
                                                       "value": key}, "state::set")
            assert written["ok"], written
    body = {"scope": victim_scope, "limit": 1}
    first = await over_bus(prefix, victim, body)
    assert first["ok"], first
    flood = {"scope": flood_scope, "limit": 1}
    posing = await over_bus(prefix, flooder, flood, caller=victim_name)
    assert posing["error"]["code"] == "PERMISSION_DENIED", posing  # (no one else's share)
    for n in range(3 * pages.MAX_SNAPSHOTS):  # first pages over both doors, never finished
        answer = await (over_http(acl_served, flooder, flood) if n % 2 else
                        over_bus(prefix, flooder, flood))
        assert answer["ok"], answer  # (never refused: it recycles its own share)
    # The victim's listing goes on over the other door, and it starts a share of new ones.
    rest = await over_http(acl_served, victim, {**body, "cursor": first["result"]["next_cursor"]})
    assert rest["ok"] and rest["result"]["done"], rest
    started = [await over_http(acl_served, victim, body) for _ in range(pages.PER_CALLER)]
    for again in started:
        assert again["ok"], again
        last = await over_bus(prefix, victim, {**body, "cursor": again["result"]["next_cursor"]})
        assert last["ok"] and last["result"]["entries"] == [["b", "b"]], last
