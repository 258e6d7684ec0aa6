"""`acl` mode: the HTTP face's logins attacked (app/logins.py). A password rotated while a
login is being checked, a flood of wrong credentials, a name that is no principal timed, the
proofs' connection closed under them, the cookie of an https page. A Redis of the module's
own: ACL users are server-wide. A password beyond ASCII proven at every door, a live tail
opened across a new password, a call whose body comes after one."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import anyio
import httpx
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateStore
from stateworker.app import logins
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.state.tenancy import principals
from tests.integration.acl import role
from tests.integration.busproto import until
from tests.servers import FaultProxy, RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def proxied(acl_redis: RedisServer, prefix: str
                  ) -> AsyncIterator[tuple[StateService, FaultProxy]]:
    """A service in `acl` mode whose every Redis connection passes a FaultProxy."""
    proxy = FaultProxy(acl_redis.port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        settings = Settings(redis_url=proxy.url, prefix=prefix, partitions=4, auth="acl",
                            http="127.0.0.1:0")
        async with StateService.running(settings, BusOptions(block_ms=50)) as service:
            yield service, proxy
        tg.cancel_scope.cancel()


def auth_of(name: str) -> bytes:
    """How an `AUTH <name> ...` starts on the wire (RESP): the marker of a login's proof."""
    return b"AUTH\r\n$%d\r\n%s\r\n" % (len(name), name.encode())


async def test_a_login_proven_across_a_new_password_is_refused(
        proxied: tuple[StateService, FaultProxy]) -> None:
    """A leaked password, and its owner's `principal passwd`: a login with the old password
    whose AUTH Redis accepted just before the change must not become a session of the new
    record (it would live its 12 hours past the rotation meant to end it)."""
    service, proxy = proxied
    state = service.state
    await principals.add_principal(state, "leaked", ["reader"], ())
    await principals.set_user(state, "leaked", "old-pass-1")
    before = state.access.principal("leaked")
    proxy.arm("late", auth_of("leaked"))  # (Redis runs the AUTH; its OK reaches us late)
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}",
                                 timeout=30) as attacker:
        async def log_in() -> None:
            answers.append(await attacker.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": "leaked", "password": "old-pass-1"})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(log_in)
            await until(lambda: proxy.held_bytes > 0, 10, "Redis to answer the old AUTH")
            await principals.set_password(state, "leaked", "new-pass-2")
            await until(lambda: state.access.principal("leaked") != before, 10,
                        "the service to see the new record")
            await proxy.release()
        (login,) = answers
        assert login.status_code == 401, login.text
        assert login.json()["error"]["code"] == "UNKNOWN_CALLER"
        session = await attacker.get("/v1/console/session")
        assert session.json()["principal"] is None, session.text


async def test_a_name_that_is_no_principal_is_answered_no_sooner(
        proxied: tuple[StateService, FaultProxy]) -> None:
    """The refusal names no difference between a name that is no principal and a wrong
    password; its timing must not either (a round trip to Redis for one, none for the
    other, told which names exist): the unknown name's password is put to Redis too."""
    service, proxy = proxied
    proxy.arm("hold", auth_of("nobody-here"))  # (that AUTH kept from Redis until release)
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}",
                                 timeout=30) as attacker:
        async def log_in() -> None:
            answers.append(await attacker.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": "nobody-here", "password": "guess-1"})))

        async with anyio.create_task_group() as tg:
            tg.start_soon(log_in)
            await until(proxy.triggered.is_set, 10, "the unknown name's AUTH to reach Redis")
            assert not answers, "answered before Redis was"
            await proxy.release()
    (login,) = answers
    assert (login.status_code, login.json()["error"]) == (401, {
        "code": "UNKNOWN_CALLER", "details": {"principal": "nobody-here"},
        "message": 'principal "nobody-here": unknown, or the password is wrong'})


async def test_wrong_credentials_open_no_connection_each(acl_served: StateService,
                                                         acl_redis: RedisServer) -> None:
    """A flood of wrong passwords (a guesser's, or a fleet's left on a rotated one): each
    refusal once cost a new connection to Redis, closed at once, its socket in TIME_WAIT on
    the service's host for a minute: ~470 a second use up the ports to a Redis of another
    host, and then no connection of the service's own opens. Now they share one."""
    state = acl_served.state
    await principals.add_principal(state, "guessed", ["reader"], ())
    await principals.set_user(state, "guessed", "right-pass-1")
    redis = acl_redis.client()
    opened = redis.info("stats")["total_connections_received"]
    async with httpx.AsyncClient(base_url=f"http://{acl_served.http_address}",
                                 timeout=30) as attacker:
        async def guess(n: int) -> None:
            basic = await attacker.post("/v1/call/state::get", auth=("guessed", f"guess-{n}"),
                                        content=b'{"scope":"orders","key":"k"}')
            login = await attacker.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": "guessed", "password": f"guess-{n}"}))
            assert basic.status_code == login.status_code == 401, (basic.text, login.text)

        async with anyio.create_task_group() as tg:
            for n in range(100):
                tg.start_soon(guess, n)
        right = await attacker.post("/v1/call/state::get", auth=("guessed", "right-pass-1"),
                                    content=b'{"scope":"orders","key":"k"}')
        assert right.status_code == 200, right.text
    assert redis.info("stats")["total_connections_received"] - opened <= 2


async def test_a_user_removed_fails_no_other_login(
        proxied: tuple[StateService, FaultProxy], acl_redis: RedisServer) -> None:
    """The proofs share one connection, whose user is the last one proven: removing that
    user (`principal remove`, or `CLIENT KILL USER`) closes it, under a login of another
    principal in flight, which is proven again on a new one rather than refused."""
    service, proxy = proxied
    for name in ("stays", "goes"):
        await principals.add_principal(service.state, name, ["reader"], ())
        await principals.set_user(service.state, name, f"{name}-pass-1")
    answers: list[int] = []
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}",
                                 timeout=30) as browser:
        async def log_in(name: str) -> None:
            answers.append((await browser.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": name, "password": f"{name}-pass-1"}))).status_code)
        await log_in("goes")
        proxy.arm("hold", auth_of("stays"))  # (in flight on the connection, not yet sent)
        async with anyio.create_task_group() as tg:
            tg.start_soon(log_in, "stays")
            await until(proxy.triggered.is_set, 10, "the login of stays to be in flight")
            acl_redis.client().execute_command("ACL", "DELUSER", "goes")
    assert answers == [200, 200]


async def test_a_login_from_an_https_page_gets_a_secure_cookie(acl_served: StateService) -> None:
    """Behind a TLS proxy the page is https and the service http: a cookie without `Secure`
    goes in clear to any http:// URL of the host a network attacker makes the browser load.
    The page's `Origin` says which (the login is a POST: browsers send it)."""
    state = acl_served.state
    await principals.add_principal(state, "tls-user", ["reader"], ())
    await principals.set_user(state, "tls-user", "tls-pass-1")
    form = b'{"principal":"tls-user","password":"tls-pass-1"}'
    address = acl_served.http_address
    async with httpx.AsyncClient(base_url=f"http://{address}", timeout=30) as browser:
        async def cookie(origin: str | None) -> list[str]:
            answer = await browser.post("/v1/console/login", content=form,
                                        headers={"Origin": origin} if origin else {})
            assert answer.status_code == 200, answer.text
            return [part.strip().lower() for part in answer.headers["set-cookie"].split(";")]
        assert "secure" in await cookie(f"https://{address}")
        assert "secure" not in await cookie(f"http://{address}")  # (plain http: it must work)
        assert "secure" not in await cookie(None)


async def test_a_session_is_every_replicas(acl_redis: RedisServer, prefix: str) -> None:
    """Two replicas behind one address (a load balancer sends each request to either): a
    session made at one serves at the other, a logout at the other ends it at both, a live
    tail open at the first too; Redis keeps no token (what it holds opens no session)."""
    settings = Settings(redis_url=acl_redis.url, prefix=prefix, partitions=4, auth="acl",
                        http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as one, \
            StateService.running(settings, BusOptions(block_ms=50)) as two:
        await principals.add_principal(one.state, "roaming", ["reader"], ())
        await principals.set_user(one.state, "roaming", "pass-1")
        await until(lambda: two.state.access.principal("roaming") is not None, 10,
                    "the second replica to know the principal")
        async with httpx.AsyncClient(base_url=f"http://{one.http_address}") as at_one, \
                httpx.AsyncClient(base_url=f"http://{two.http_address}") as at_two:
            login = await at_one.post("/v1/console/login", content=msgspec.json.encode(
                {"principal": "roaming", "password": "pass-1"}))
            assert login.status_code == 200, login.text
            token = at_one.cookies["sw_session"]
            at_two.cookies.set("sw_session", token)
            assert (await at_two.get("/v1/console/session")).json()["principal"] == "roaming"
            conn = aredis.Redis.from_url(acl_redis.url)
            try:
                kept = [(key, await conn.dump(key)) async for key in conn.scan_iter(f"{prefix}*")]
            finally:
                await conn.aclose()
            assert kept and not any(token.encode() in key + (value or b"") for key, value in kept)
            async with at_one.stream("GET", "/v1/console/tail?scope=orders") as tail:
                assert tail.status_code == 200
                lines = tail.aiter_lines()
                assert (await anext(lines)) == ": watching"
                out = await at_two.post("/v1/console/logout")
                assert out.status_code == 200 and out.json()["principal"] is None
                for client in (at_one, at_two):
                    assert (await client.get("/v1/console/session")).json()["principal"] is None
                with anyio.fail_after(10):  # (the tail must end: its events keep coming)
                    async with anyio.create_task_group() as tg:
                        async def write() -> None:
                            n = 0
                            while True:
                                n += 1
                                await StateStore(one.state).set("orders", "k", n)
                                await anyio.sleep(0.05)  # (a pace, not a wait for anything)
                        tg.start_soon(write)
                        seen = [line async for line in lines]
                        tg.cancel_scope.cancel()
                # (an event before the logout's news came may show: at most a recheck's worth)
                assert all(line.startswith(("data:", ":")) or not line for line in seen), seen


async def test_a_session_whose_key_lost_its_expiry_still_ends(
        acl_served: StateService, acl_redis: RedisServer, prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A session ends at its end even when its key's expiry is gone (a `PERSIST` by an
    operator's tool, a key copied without its TTL): the end is in the record too."""
    monkeypatch.setattr(logins, "SESSION_S", 1.0)
    await principals.add_principal(acl_served.state, "brief", ["reader"], ())
    await principals.set_user(acl_served.state, "brief", "pass-1")
    async with httpx.AsyncClient(base_url=f"http://{acl_served.http_address}") as browser:
        login = await browser.post("/v1/console/login", content=msgspec.json.encode(
            {"principal": "brief", "password": "pass-1"}))
        assert login.status_code == 200, login.text
        conn = aredis.Redis.from_url(acl_redis.url)
        try:
            (key,) = await conn.keys(f"{prefix}:*session:*")
            assert await conn.persist(key)
        finally:
            await conn.aclose()

        async def ended() -> bool:
            return (await browser.get("/v1/console/session")).json()["principal"] is None
        await until(ended, 10, "the session to end at its end")


async def test_a_password_beyond_ascii_proves_its_principal_at_every_door(
        acl_served: StateService) -> None:
    """`principal passwd --password-stdin` takes any text: the password's UTF-8 bytes are
    what Redis holds, and each door proves the principal with them (Basic's are base64 of
    UTF-8, a login form's JSON is UTF-8, and Dapr's `dapr-api-token` is sent as UTF-8)."""
    state = acl_served.state
    writer = await role(state, ["read", "write"], ["statestore"])
    await principals.add_principal(state, "umlaut", [writer], ())
    password = "pässwörd-ü1"
    await principals.set_user(state, "umlaut", password)
    pair = f"umlaut:{password}".encode()
    async with httpx.AsyncClient(base_url=f"http://{acl_served.http_address}") as http:
        basic = await http.post("/v1/call/state::set", headers={
            "Authorization": b"Basic " + base64.b64encode(pair)},
            content=b'{"scope":"statestore","key":"by-basic","value":1}')
        assert basic.status_code == 200, basic.text
        login = await http.post("/v1/console/login", content=msgspec.json.encode(
            {"principal": "umlaut", "password": password}))
        assert login.status_code == 200, login.text
        http.cookies.clear()
        dapr = await http.post("/v1.0/state/statestore", headers={"dapr-api-token": pair},
                               content=b'[{"key":"by-dapr","value":2}]')
        assert dapr.status_code == 204, dapr.text
        bad = await http.get("/v1.0/state/statestore/by-dapr",
                             headers={"dapr-api-token": b"umlaut:p\xe4ss"})
        assert (bad.status_code, bad.json()["details"][0]["reason"],
                bad.json()["details"][0]["metadata"]["path"]) == (
            400, "INVALID_REQUEST", "dapr-api-token"), bad.text
    assert await StateStore(state).get("statestore", "by-dapr") == 2


async def test_a_tail_opened_across_a_new_password_ends_with_the_old_one(
        proxied: tuple[StateService, FaultProxy]) -> None:
    """A leaked password's holder opens a live tail with it (Basic) while its owner runs
    `principal passwd`: the new record comes while the tail's watch opens. The tail was
    proven under the old record, so it ends, as a tail opened a moment before would; kept
    under the new one it would show the scope's changes for good."""
    service, proxy = proxied
    state, store = service.state, StateStore(service.state)
    await principals.add_principal(state, "leaked2", [await role(state, ["read"], ["orders"])],
                                   ())
    await principals.set_user(state, "leaked2", "old-pass-1")
    before = state.access.principal("leaked2")
    seen: list[str] = []
    async with httpx.AsyncClient(base_url=f"http://{service.http_address}", timeout=30,
                                 auth=("leaked2", "old-pass-1")) as attacker, \
            anyio.create_task_group() as tg:
        opened = anyio.Event()

        async def tail() -> None:
            async with attacker.stream("GET", "/v1/console/tail?scope=orders") as answer:
                assert answer.status_code == 200, await answer.aread()
                opened.set()
                with anyio.fail_after(10):  # (it must end: left open it fails here)
                    async for line in answer.aiter_lines():
                        seen.append(line)
                        if "after-passwd" in line:
                            return
        # (the watch's first read, of the partition count: its answer kept until released)
        proxy.arm("late", b"$10\r\npartitions\r\n")
        tg.start_soon(tail)
        await until(proxy.triggered.is_set, 10, "the tail's watch to be opening")
        await principals.set_password(state, "leaked2", "new-pass-2")
        await until(lambda: state.access.principal("leaked2") != before, 10,
                    "the service to know the new record")
        await proxy.release()
        await opened.wait()
        await store.set("orders", "k", "after-passwd")
    assert not any("after-passwd" in line for line in seen), seen


async def test_a_call_whose_body_comes_after_a_new_password_is_refused(
        acl_served: StateService) -> None:
    """A leaked password's holder sends calls' heads (proven at once) and holds their bodies
    back (a body may take 60 s); its owner runs `principal passwd`. A body sent after the
    new record is known runs nothing: the proof ended with the password it proved."""
    state = acl_served.state
    await principals.add_principal(state, "slow", [await role(state, ["write"], ["orders"])], ())
    await principals.set_user(state, "slow", "old-pass-1")
    before = state.access.principal("slow")
    body = b'{"scope":"orders","key":"k","value":"after-passwd"}'
    host, port = acl_served.http_address.rsplit(":", 1)
    async with await anyio.connect_tcp(host, int(port)) as stream:
        await stream.send(b"POST /v1/call/state::set HTTP/1.1\r\nHost: %s\r\nAuthorization: "
                          b"Basic %s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % (
                              acl_served.http_address.encode(),
                              base64.b64encode(b"slow:old-pass-1"), len(body)))
        with anyio.fail_after(10):  # (sent when the service reads the body: it has proven it)
            assert (await stream.receive()).startswith(b"HTTP/1.1 100 Continue"), "no 100"
        await principals.set_password(state, "slow", "new-pass-2")
        await until(lambda: state.access.principal("slow") != before, 10,
                    "the service to know the new record")
        await stream.send(body)
        answer = b""
        with anyio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                answer += await stream.receive()
    assert answer.startswith(b"HTTP/1.1 401") and b"UNKNOWN_CALLER" in answer, answer
    assert await StateStore(state).get("orders", "k") is None
