"""`acl` mode: a principal opens Redis connections up to `maxclients`, which every connection
shares (Redis has no limit per user). The service keeps the connections it holds and serves
on, its HTTP logins too; a connection it must open anew is refused UNAVAILABLE naming
`maxclients` (before: a ReplyError, 500 INTERNAL); and it serves again once the principal
lets go. A Redis of the test's own, its `maxclients` a few past what is connected."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.integration.acl import client_of, credentials, principal, role
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOM = 20  # connections left to the attacker


async def test_a_principal_holding_every_redis_connection(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    admin = aredis.Redis(port=server.port)  # the operator's, opened before the flood
    flood: list[aredis.Redis] = []
    try:
        settings = Settings(redis_url=server.url, prefix=prefix, partitions=4, auth="acl",
                            http="127.0.0.1:0")
        async with StateService.running(settings, BusOptions(block_ms=50)) as service:
            writer = await role(service.state, ["read", "write"], ["*"])
            _, honest = await principal(service.state, server, [writer])
            _, attacker = await principal(service.state, server, [writer])
            get = {"scope": "s", "key": "k"}
            async with client_of(honest, prefix) as before, httpx.AsyncClient(
                    base_url=f"http://{service.http_address}", auth=credentials(honest),
                    timeout=30) as http:
                await before.call("state::set", {**get, "value": 1})
                connected = (await admin.info("clients"))["connected_clients"]
                await admin.config_set("maxclients", connected + ROOM)
                while len(flood) <= ROOM:  # the attacker takes every place left
                    conn = aredis.Redis.from_url(attacker)
                    try:
                        await conn.ping()
                    except aredis.ConnectionError as exc:
                        assert "max number of clients" in str(exc), exc
                        await conn.aclose()
                        break
                    flood.append(conn)
                assert len(flood) == ROOM

                # what the service holds serves on: a bus call, a first HTTP login
                assert await before.call("state::get", get) == 1
                answer = await http.post("/v1/call/state::get", json=get)
                assert (answer.status_code, answer.json()["result"]) == (200, 1), answer.text

                # a blip cuts the service's connections, and Redis's places stay taken
                mine = (await admin.client_info())["id"]
                cut = [c["id"] for c in await admin.client_list()
                       if c["user"] == "default" and c["id"] != mine]
                async with admin.pipeline(transaction=True) as blip:
                    for client in cut:
                        blip.client_kill_filter(_id=client)
                    blip.config_set("maxclients", connected + ROOM - len(cut))
                    await blip.execute()
                answer = await http.post("/v1/call/state::get", json=get)
                error = answer.json()["error"]
                assert (answer.status_code, error["code"]) == (503, "UNAVAILABLE"), error
                assert "maxclients" in error["message"], error
                ready = await http.get("/readyz")
                assert ready.status_code == 503 and "maxclients" in ready.json()["reason"]

                for conn in flood:  # the attacker lets go: served again
                    await conn.aclose()
                flood.clear()
                await admin.config_set("maxclients", 10_000)

                async def served() -> bool:
                    answer = await http.post("/v1/call/state::get", json=get)
                    return answer.status_code == 200
                await until(served, 20, "the service to reconnect")
                assert await before.call("state::get", get) == 1
    finally:
        for conn in flood:
            await conn.aclose()
        await admin.aclose()
        server.kill()
