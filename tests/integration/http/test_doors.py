"""`acl` mode: one identity through every door. A call id is the principal's own whatever door
it comes through: an HTTP `Idempotency-Key` is `<principal>/<key>` as a bus entry's id is, so
a key another principal names (even one written as `bob/...`) never binds bob's calls, and two
principals' equal keys never meet. A Redis of the module's own: ACL users are server-wide."""

from __future__ import annotations

import argparse
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateStore
from stateworker.app import admin, logins
from stateworker.app.hosts import LOOPBACK, allowed_hosts, host_of
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import principal_reply_prefix, principal_stream
from stateworker.settings import Settings
from stateworker.state.tenancy import principals
from tests.integration.acl import credentials, principal, role
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def http_set(base: str, url: str, key: str, idempotency_key: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=base, auth=credentials(url)) as client:
        answer = await client.post("/v1/call/state::set", headers={
            "Idempotency-Key": idempotency_key},
            content=msgspec.json.encode({"scope": "orders", "key": key, "value": 1}))
    document: dict[str, Any] = answer.json()
    return document


async def bus_set(url: str, prefix: str, key: str, call_id: str) -> dict[str, Any]:
    name = credentials(url)[0]
    reply = principal_reply_prefix(prefix, name) + uuid.uuid4().hex[:8]
    conn = aredis.Redis.from_url(url)
    try:
        await conn.xadd(principal_stream(prefix, "state", name), {
            "id": call_id, "fn": "state::set", "reply": reply,
            "body": msgspec.json.encode({"scope": "orders", "key": key, "value": 2})})
        popped = await conn.execute_command("BLMPOP", 20, 1, reply, "LEFT")
    finally:
        await conn.aclose()
    document: dict[str, Any] = msgspec.json.decode(popped[1][0])
    return document


async def test_an_idempotency_key_is_the_principals_own(acl_served: StateService,
                                                       acl_redis: RedisServer,
                                                       prefix: str) -> None:
    writer = await role(acl_served.state, ["read", "write"], ["orders"])
    _, alice = await principal(acl_served.state, acl_redis, [writer])
    bob_name, bob = await principal(acl_served.state, acl_redis, [writer])
    base = f"http://{acl_served.http_address}"
    # alice names bob's own id over HTTP: it is hers, `<alice>/<bob>/order-42`
    squat = await http_set(base, alice, "a", f"{bob_name}/order-42")
    assert squat["ok"], squat
    mine = await bus_set(bob, prefix, "b", "order-42")
    assert mine["ok"], f"bob's call with his own id, after alice named it: {mine}"
    # the same key from two principals over HTTP: two calls
    first = await http_set(base, alice, "c", "same-key")
    second = await http_set(base, bob, "d", "same-key")
    assert first["ok"] and second["ok"], (first, second)
    # and a principal's own retry over HTTP is still answered from its record
    again = await http_set(base, alice, "c", "same-key")
    assert again == first


async def test_a_principal_cannot_write_where_nobody_reads(acl_served: StateService,
                                                           acl_redis: RedisServer,
                                                           prefix: str) -> None:
    """Its ACL user works in database 0 only: no SELECT, so no XADD of its own stream's name
    in a database no service reads."""
    writer = await role(acl_served.state, ["read", "write"], ["orders"])
    _, url = await principal(acl_served.state, acl_redis, [writer])
    conn = aredis.Redis.from_url(url)
    try:
        with pytest.raises(aredis.ResponseError, match="no permissions to run the 'select'"):
            await conn.execute_command("SELECT", 3)
    finally:
        await conn.aclose()
    assert (await bus_set(url, prefix, "e", "in-db-0"))["ok"]  # (database 0: acl_served)


@pytest.fixture
async def open_service(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateService]:
    """`off` mode (no credential at all), bound to loopback."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        yield service


async def test_a_request_for_a_host_the_service_is_not_is_refused(
        open_service: StateService) -> None:
    """DNS rebinding: a page under the attacker's name, resolved to this service's address,
    sends `Origin` and `Host` both its own: the same-origin guard alone lets it through."""
    base = f"http://{open_service.http_address}"
    body = msgspec.json.encode({"scope": "orders", "key": "k", "value": 1})
    async with httpx.AsyncClient(base_url=base) as client:
        rebound = {"Host": "evil.example:8080", "Origin": "http://evil.example:8080"}
        for path, method in (("/v1/call/state::set", "POST"), ("/v1.0/state/statestore", "POST"),
                             ("/v1.0/state/statestore/k", "GET"), ("/readyz", "GET")):
            answer = await client.request(method, path, headers=rebound, content=body)
            assert answer.status_code == 403, (path, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "PERMISSION_DENIED" and "evil.example" in error["message"]
        for host in ("127.0.0.1", "localhost", "[::1]"):
            port = open_service.http_address.rsplit(":", 1)[1]
            answer = await client.post("/v1/call/state::set", content=body,
                                       headers={"Host": f"{host}:{port}"})
            assert answer.status_code == 200, (host, answer.text)
    assert await StateStore(open_service.state).get("orders", "k") == 1


def test_the_names_answered_to() -> None:
    assert allowed_hosts(Settings(http="127.0.0.1:8080")) == LOOPBACK
    assert allowed_hosts(Settings(http="10.0.0.5:8080")) == LOOPBACK | {"10.0.0.5"}
    assert allowed_hosts(Settings(http="0.0.0.0:8080")) == LOOPBACK  # (every address: none)
    assert allowed_hosts(Settings(http="[::]:8080")) == LOOPBACK
    assert allowed_hosts(Settings(http="0.0.0.0:8080", http_hosts="state.internal, [::1]")) \
        == {"state.internal", "::1"}
    assert allowed_hosts(Settings(http_hosts="*")) is None
    assert host_of(b"[::1]:8080") == "::1" and host_of(b"Example.COM") == "example.com"


async def test_the_console_keeps_private_namespaces_private(acl_served: StateService) -> None:
    """A reader (the built-in role: read on every scope) gets no claimed scope through the
    console, as it gets none through the public functions: its history is RESERVED_SCOPE,
    and an unscoped tail leaves its changes out."""
    store = StateStore(acl_served.state)  # (in process: trusted)
    await store.claim_namespace("billing", ["private"], caller="billing")
    await principals.add_principal(acl_served.state, "rd", ["reader"], ())
    await principals.set_user(acl_served.state, "rd", "read-pass-1")
    auth = ("rd", "read-pass-1")
    async with httpx.AsyncClient(base_url=f"http://{acl_served.http_address}", auth=auth,
                                 timeout=30) as http:
        await store.call("billing::state::compare-and-set",
                         {"scope": "private", "key": "secret", "value": "s3cr3t"})
        history = await http.get("/v1/console/history?scope=private&key=secret")
        assert (history.status_code, history.json()["error"]["code"]) == (403, "RESERVED_SCOPE")
        await store.set("public", "open", 1)  # (a public scope's history: as before)
        public = await http.get("/v1/console/history?scope=public&key=open")
        assert public.status_code == 200 and public.json()["events"], public.text
        scoped = await http.get("/v1/console/tail?scope=private")
        assert scoped.json()["error"]["code"] == "RESERVED_SCOPE"
        async with http.stream("GET", "/v1/console/tail") as tail:
            await store.call("billing::state::compare-and-set",
                             {"scope": "private", "key": "secret2", "value": "s3cr3t2"})
            await store.set("public", "after", 1)
            seen: list[str] = []
            with anyio.fail_after(20):
                async for line in tail.aiter_lines():
                    seen.append(line)
                    if '"after"' in line:
                        break
    assert not any("s3cr3t" in line or "private" in line for line in seen), seen


async def test_a_new_password_ends_the_sessions_of_the_old_one(acl_served: StateService) -> None:
    """The documented leaked-password procedure (`principal passwd`): the console session and
    the proven Basic credential of the old password stop working within seconds."""
    writer = await role(acl_served.state, ["read", "write"], ["orders"])
    await principals.add_principal(acl_served.state, "ed", [writer], ())
    await principals.set_user(acl_served.state, "ed", "old-pass-1")
    body = msgspec.json.encode({"scope": "orders", "key": "k", "value": 1})
    base = f"http://{acl_served.http_address}"
    async with httpx.AsyncClient(base_url=base) as browser, \
            httpx.AsyncClient(base_url=base, auth=("ed", "old-pass-1")) as program:
        login = await browser.post("/v1/console/login",
                                   content=b'{"principal":"ed","password":"old-pass-1"}')
        assert login.status_code == 200, login.text  # (the client keeps the cookie)
        assert (await browser.post("/v1/call/state::set", content=body)).json()["ok"]
        assert (await program.post("/v1/call/state::set", content=body)).json()["ok"]
        await principals.set_password(acl_served.state, "ed", "new-pass-2")

        async def refused() -> bool:
            by_cookie = await browser.post("/v1/call/state::set", content=body)
            by_basic = await program.post("/v1/call/state::set", content=body)
            return by_cookie.status_code == 401 and by_basic.status_code == 401
        await until(refused, 10, "the old password's session and proof to end")
        assert (await program.post("/v1/call/state::set", content=body,
                                   auth=("ed", "new-pass-2"))).json()["ok"]


@pytest.mark.parametrize(("in_all", "per_caller", "which"), [(5, 2, "open by"),
                                                             (2, 5, "open in all")])
async def test_live_tails_beyond_their_cap_are_refused(
        redis_server: RedisServer, prefix: str, in_all: int, per_caller: int,
        which: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0", max_tails=in_all, max_tails_per_caller=per_caller)
    cap = min(in_all, per_caller)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}", timeout=30) as http, \
            contextlib.AsyncExitStack() as tails:
        long_name = "s" * (settings.max_key_bytes + 1)  # (refused: it holds no place)
        for _ in range(cap + 1):
            async with http.stream("GET", f"/v1/console/tail?scope={long_name}") as refused:
                assert refused.status_code == 400
                error = msgspec.json.decode(await refused.aread())["error"]
            assert (error["code"], error["details"]["path"]) == ("KEY_TOO_LONG", "$.scope")
        for _ in range(cap + 1):  # (a HEAD opens no tail: it holds no place)
            head = await http.head("/v1/console/tail")
            assert (head.status_code, head.headers["content-type"]) == (
                200, "text/event-stream; charset=utf-8"), head
        opened = [await tails.enter_async_context(http.stream("GET", "/v1/console/tail"))
                  for _ in range(cap)]
        assert all(t.status_code == 200 for t in opened)
        over = await http.get("/v1/console/tail")
        assert over.status_code == 507
        error = over.json()["error"]
        assert error["code"] == "RESOURCE_EXHAUSTED" and which in error["message"]
        assert error["details"]["limit"] == cap
        metrics = (await http.get("/metrics")).text
        assert f"\nstateworker_console_tails {float(cap)}\n" in metrics
        assert "\nstateworker_console_tails_refused_total 1.0\n" in metrics
        await opened[0].aclose()  # one closed: its place is free again

        async def reopened() -> bool:
            again = await tails.enter_async_context(http.stream("GET", "/v1/console/tail"))
            if again.status_code == 200:
                return True
            await again.aclose()
            return False
        await until(reopened, 10, "a tail's place to come free")


async def test_another_sites_page_cannot_take_the_tails_of_the_users_address(
        redis_server: RedisServer, prefix: str) -> None:
    """A page of another site opens EventSources on the console's tail: they come from the
    user's own address and would take its few slots, leaving the console's own tail refused
    (507). A browser sends `Origin` with them: a foreign one is refused, holding no slot."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0", max_tails_per_caller=2)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}", timeout=30) as http, \
            contextlib.AsyncExitStack() as tails:
        foreign = {"Origin": "http://localhost:1"}
        for _ in range(3):
            async with http.stream("GET", "/v1/console/tail", headers=foreign) as refused:
                assert refused.status_code == 403
                error = msgspec.json.decode(await refused.aread())["error"]
            assert (error["code"], error["details"]["path"]) == ("PERMISSION_DENIED", "Origin")
        own = {"Origin": f"http://{service.http_address}"}
        opened = [await tails.enter_async_context(http.stream(
            "GET", "/v1/console/tail", headers=headers)) for headers in (own, {})]
        assert [t.status_code for t in opened] == [200, 200]  # (the console's, a program's)


async def test_dapr_paths_act_as_the_principal_of_dapr_api_token(
        acl_served: StateService, acl_redis: RedisServer) -> None:
    """Dapr's SDKs send DAPR_API_TOKEN as `dapr-api-token`: `<principal>:<password>` is that
    principal, whose roles decide as on every other door; none, or a wrong one, is 401."""
    writer = await role(acl_served.state, ["read", "write"], ["statestore"])
    reader = await role(acl_served.state, ["read"], ["statestore"])
    writer_token = ":".join(credentials((await principal(acl_served.state, acl_redis, [writer]))[1]))
    reader_token = ":".join(credentials((await principal(acl_served.state, acl_redis, [reader]))[1]))
    url = f"http://{acl_served.http_address}/v1.0/state/statestore"
    item = b'[{"key":"k","value":1}]'
    async with httpx.AsyncClient() as client:
        saved = await client.post(url, content=item, headers={"dapr-api-token": writer_token})
        assert saved.status_code == 204, saved.text
        got = await client.get(f"{url}/k", headers={"dapr-api-token": reader_token})
        assert (got.status_code, got.json()) == (200, 1)
        denied = await client.post(url, content=item, headers={"dapr-api-token": reader_token})
        assert (denied.status_code, denied.json()["details"][0]["reason"]) == (
            403, "PERMISSION_DENIED")
        for headers in ({}, {"dapr-api-token": writer_token + "x"}):
            refused = await client.post(url, content=item, headers=headers)
            assert (refused.status_code, refused.json()["details"][0]["reason"]) == (
                401, "UNKNOWN_CALLER"), headers
    assert await StateStore(acl_served.state).get("statestore", "k") == 1


async def test_a_live_tail_ends_with_its_login_or_its_grant(acl_served: StateService) -> None:
    """A tail is checked at every event, not only at its open: a logout ends the session's
    tail, a new password the Basic credential's, a role losing the scope the tail of a
    principal of that role; none of them shows what was written after."""
    state, store = acl_served.state, StateStore(acl_served.state)
    await principals.add_principal(state, "tailer", [await role(state, ["read"], ["orders"])], ())
    await principals.set_user(state, "tailer", "pass-1")
    keeper_role = await role(state, ["read"], ["orders"])
    await principals.add_principal(state, "keeper", [keeper_role], ())
    await principals.set_user(state, "keeper", "keep-1")
    base = f"http://{acl_served.http_address}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as browser, \
            httpx.AsyncClient(base_url=base, timeout=30, auth=("tailer", "pass-1")) as program, \
            httpx.AsyncClient(base_url=base, timeout=30, auth=("keeper", "keep-1")) as keeper, \
            contextlib.AsyncExitStack() as stack:
        login = await browser.post("/v1/console/login",
                                   content=b'{"principal":"tailer","password":"pass-1"}')
        assert login.status_code == 200, login.text
        by_session, by_basic, by_role = [
            (await stack.enter_async_context(client.stream(
                "GET", "/v1/console/tail?scope=orders"))).aiter_lines()
            for client in (browser, program, keeper)]

        async def shows(lines: AsyncIterator[str], value: str) -> None:
            with anyio.fail_after(10):
                async for line in lines:
                    if value in line:
                        return
            raise AssertionError(f"the tail ended before {value}")

        async def ends_without(lines: AsyncIterator[str], value: str) -> None:
            with anyio.fail_after(10):  # (the stream must end: a tail left open fails here)
                seen = [line async for line in lines]
            assert not any(value in line for line in seen), seen

        await browser.post("/v1/console/logout")
        await store.set("orders", "k", "after-logout")
        await ends_without(by_session, "after-logout")
        await shows(by_basic, "after-logout")
        await principals.set_password(state, "tailer", "pass-2")

        async def status_is(client: httpx.AsyncClient, status: int) -> bool:
            return (await client.get("/v1/console/history?scope=orders&key=k")).status_code \
                == status
        await until(lambda: status_is(program, 401), 10, "the old password to be refused")
        await store.set("orders", "k", "after-passwd")
        await ends_without(by_basic, "after-passwd")
        await shows(by_role, "after-passwd")
        await principals.add_role(state, keeper_role, ["read"], ["elsewhere"], False, [])
        await until(lambda: status_is(keeper, 403), 10, "the role to lose orders")
        await store.set("orders", "k", "after-role")
        await ends_without(by_role, "after-role")


async def test_principal_remove_ends_its_sessions_at_once(acl_served: StateService,
                                                         acl_redis: RedisServer,
                                                         prefix: str) -> None:
    """`principal remove` deletes the ACL user, then waits for the principal's streams to
    drain: its console session and proven Basic credential end with the user, not with the
    record (here a stream that never drains: the remove times out, the record stays)."""
    writer = await role(acl_served.state, ["read", "write"], ["orders"])
    await principals.add_principal(acl_served.state, "leaver", [writer], ())
    await principals.set_user(acl_served.state, "leaver", "pass-1")
    conn = aredis.Redis.from_url(acl_redis.url)
    ghost = principal_stream(prefix, "ghost", "leaver")  # (a service not running now)
    await conn.xgroup_create(ghost, "ghost", id="0", mkstream=True)
    await conn.xadd(ghost, {"id": "1", "fn": "x", "body": "{}"})
    await conn.aclose()
    body = msgspec.json.encode({"scope": "orders", "key": "k", "value": "after-removal"})
    base = f"http://{acl_served.http_address}"
    async with httpx.AsyncClient(base_url=base) as browser, \
            httpx.AsyncClient(base_url=base, auth=("leaver", "pass-1")) as program:
        login = await browser.post("/v1/console/login",
                                   content=b'{"principal":"leaver","password":"pass-1"}')
        assert login.status_code == 200, login.text
        assert (await program.post("/v1/call/state::set", content=b'{"scope":"orders",'
                                   b'"key":"k","value":"before"}')).json()["ok"]
        removal = argparse.Namespace(name="leaver", timeout=0.5)
        assert await admin.principal_remove(acl_served.state, removal) == 1  # (timed out)

        async def refused() -> bool:
            by_cookie = await browser.post("/v1/call/state::set", content=body)
            by_basic = await program.post("/v1/call/state::set", content=body)
            return by_cookie.status_code == 401 and by_basic.status_code == 401
        await until(refused, 10, "the removed principal's session and proof to end")
    assert await StateStore(acl_served.state).get("orders", "k") == "before"


async def test_console_sessions_are_capped(acl_served: StateService, acl_redis: RedisServer,
                                           prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A principal has at most SESSIONS_PER_PRINCIPAL sessions (a new login ends its oldest),
    so logging in again and again fills no memory; another principal's are its own, and a
    logout frees its place. (The cap lowered: the same at 16.)"""
    monkeypatch.setattr(logins, "SESSIONS_PER_PRINCIPAL", 3)
    reading = await role(acl_served.state, ["read"], ["orders"])
    for name in ("often", "other"):
        await principals.add_principal(acl_served.state, name, [reading], ())
        await principals.set_user(acl_served.state, name, f"{name}-pass-1")
    base = f"http://{acl_served.http_address}"
    conn = aredis.Redis.from_url(acl_redis.url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(conn.aclose)

        async def logged_in(name: str) -> httpx.AsyncClient:
            client = await stack.enter_async_context(httpx.AsyncClient(base_url=base))
            answer = await client.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": name, "password": f"{name}-pass-1"}))
            assert answer.status_code == 200, answer.text
            return client

        async def who(client: httpx.AsyncClient) -> str | None:
            principal: str | None = (await client.get("/v1/console/session")).json()["principal"]
            return principal

        async def kept(name: str) -> int:
            stored = [await conn.get(key) for key in await conn.keys(f"{prefix}:*session:*")]
            return sum(1 for value in stored if msgspec.json.decode(value)[0] == name)
        often = [await logged_in("often") for _ in range(5)]
        assert [await who(client) for client in often] == [None, None] + ["often"] * 3
        others = [await logged_in("other") for _ in range(2)]
        assert [await who(client) for client in others] == ["other", "other"]
        assert await kept("often") == 3 and await kept("other") == 2
        await often[2].post("/v1/console/logout")  # (a place free again: nobody else ends)
        assert await kept("often") == 2
        late = await logged_in("often")
        assert [await who(client) for client in [*often[3:], late]] == ["often"] * 3
        assert await conn.zcard(acl_served.state.keys.sessions_of("often")) == 3
