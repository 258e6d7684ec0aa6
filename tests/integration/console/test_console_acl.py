"""The console in `acl` mode, in a real headless chromium: it asks for a login, refuses a
wrong password, and a principal's roles decide what its writes do: a read-only principal's
Put is refused (PERMISSION_DENIED shown, the value unchanged) where a writer's goes through.
The HTTP call API takes the same principals with Basic credentials. A Redis of the module's
own: ACL users are server-wide."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import httpx
import pytest

from benchmarks.browser import Browser
from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.state.tenancy import principals
from tests.integration.acl import role
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def served(acl_redis: RedisServer, prefix: str) -> AsyncIterator[StateService]:
    settings = settings_for(acl_redis, prefix, auth="acl", http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        await StateStore(service.state).set("orders", "o-1", {"total": 1})  # (in process: trusted)
        yield service


async def add(service: StateService, name: str, password: str, *, read_only: bool) -> None:
    granted = await role(service.state, ["read", "write"], ["orders"], read_only=read_only)
    await principals.add_principal(service.state, name, [granted], ())
    await principals.set_user(service.state, name, password)


async def log_in(browser: Browser, base: str, name: str, password: str) -> None:
    await browser.open(f"{base}/console/#/keys/orders/o-1")
    await browser.wait("the login form", lambda d: d.find_element("id", "login").is_displayed())
    await browser.type("login-principal", name)
    await browser.type("login-password", password)
    await browser.click("login-submit")


async def test_a_read_only_principal_is_refused_a_write(served: StateService,
                                                         browser: Browser) -> None:
    base = f"http://{served.http_address}"
    await add(served, "viewer", "view-pass-1", read_only=True)
    await log_in(browser, base, "viewer", "wrong-password")
    assert "UNKNOWN_CALLER" in await browser.wait_text("login-error", "password is wrong")
    await browser.screenshot("login")

    await log_in(browser, base, "viewer", "view-pass-1")
    await browser.wait_text("who", "principal viewer")
    await browser.wait_text("entry-title", "orders / o-1")
    await browser.type("write-value", '{"total": 99}')
    await browser.click("write-put")
    refused = await browser.wait_text("write-result", "refused")
    assert "PERMISSION_DENIED" in refused and "viewer" in refused, refused
    await browser.screenshot("refused")
    assert await StateStore(served.state).get("orders", "o-1") == {"total": 1}


async def test_a_writer_writes_and_logs_out(served: StateService, browser: Browser) -> None:
    base = f"http://{served.http_address}"
    await add(served, "editor", "edit-pass-1", read_only=False)
    await log_in(browser, base, "editor", "edit-pass-1")
    await browser.wait_text("entry-title", "orders / o-1")
    await browser.type("write-value", '{"total": 2}')
    await browser.click("write-put")
    await browser.wait_text("write-result", "state::set: done")
    assert await StateStore(served.state).get("orders", "o-1") == {"total": 2}
    assert "editor" in await browser.wait_text("entry-meta", "editor")  # updated_by
    await browser.click("logout")
    await browser.wait("the login form", lambda d: d.find_element("id", "login").is_displayed())


async def test_http_calls_in_acl_mode_carry_basic_credentials(served: StateService) -> None:
    await add(served, "reader", "read-pass-1", read_only=True)

    def basic(name: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}

    get = b'{"scope":"orders","key":"o-1"}'
    async with httpx.AsyncClient(base_url=f"http://{served.http_address}") as http:
        anonymous = await http.post("/v1/call/state::get", content=get)
        assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "UNKNOWN_CALLER")
        wrong = await http.post("/v1/call/state::get", content=get,
                                headers=basic("reader", "nope"))
        assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "UNKNOWN_CALLER")
        read = await http.post("/v1/call/state::get", content=get,
                               headers=basic("reader", "read-pass-1"))
        assert read.json() == {"id": None, "ok": True, "result": {"total": 1}}
        write = await http.post("/v1/call/state::set", headers=basic("reader", "read-pass-1"),
                                content=b'{"scope":"orders","key":"o-1","value":5}')
        assert (write.status_code, write.json()["error"]["code"]) == (403, "PERMISSION_DENIED")
        other = await http.post("/v1/call/state::get", headers=basic("reader", "read-pass-1"),
                                content=b'{"scope":"stock","key":"s"}')
        assert other.json()["error"]["code"] == "PERMISSION_DENIED"
        for body in (b"not json", b'{"principal": 1}'):  # a bad login form: named, 400
            bad = await http.post("/v1/console/login", content=body)
            assert (bad.status_code, bad.json()["error"]["code"]) == (400, "INVALID_REQUEST")
        huge = await http.post("/v1/console/login", content=b" " * 100_000)
        assert (huge.status_code, huge.json()["error"]["code"]) == (413, "VALUE_TOO_LARGE")
        overview = await http.get("/v1/console/overview", headers=basic("reader", "read-pass-1"))
        assert overview.status_code == 403  # not an admin
        tail = await http.get("/v1/console/tail?scope=stock",
                              headers=basic("reader", "read-pass-1"))
        assert tail.json()["error"]["code"] == "PERMISSION_DENIED"
    assert await StateStore(served.state).get("orders", "o-1") == {"total": 1}



async def test_metrics_in_acl_mode_need_a_read_role_on_every_scope(served: StateService) -> None:
    await add(served, "orders-only", "pass-1", read_only=True)  # read on "orders" alone
    everywhere = await role(served.state, ["read"], ["*"], read_only=True)
    await principals.add_principal(served.state, "scraper", [everywhere], ())
    await principals.set_user(served.state, "scraper", "pass-2")

    def basic(name: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}

    async with httpx.AsyncClient(base_url=f"http://{served.http_address}") as http:
        assert (await http.get("/metrics")).status_code == 401
        narrow = await http.get("/metrics", headers=basic("orders-only", "pass-1"))
        assert (narrow.status_code, narrow.json()["error"]["code"]) == (403, "PERMISSION_DENIED")
        scraped = await http.get("/metrics", headers=basic("scraper", "pass-2"))
        assert scraped.status_code == 200 and "stateworker_redis_up 1.0" in scraped.text
        assert (await http.get("/healthz")).status_code == 200
