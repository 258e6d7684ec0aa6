"""The console's keys view in a real headless chromium (`off` mode): a key's detail opens
beside a long list with its row marked, numbers keep their exact digits in a value and in a
diff, a large value is folded with its size and a download, values are searched through
`state::query`, and the console edits a service bound to loopback (but not one bound to every
address). Screenshots: docs/screenshots/detail.png, search.png, folded.png, edit.png."""

from __future__ import annotations

import json

import httpx
import pytest

from benchmarks.browser import Browser
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

BIG = 9007199254740993  # 2**53 + 1: a double reads it as ...992


async def test_a_keys_detail_opens_beside_a_long_list_with_its_row_marked(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set-many", {"scope": "wide", "entries": [
        {"key": f"k{n:05d}", "value": {"n": n}} for n in range(150)]})
    await browser.open(f"{base}/console/#/keys/wide")
    await browser.wait_text("page-note", "150 keys on page 1")
    assert "wide\n150" in await browser.wait_text("scopes", "150")  # the scope's key count
    await browser.click_row("entries", "k00119")  # the 120th row
    await browser.wait_text("entry-title", "wide / k00119")
    # The detail is in the viewport as the click left it: no scrolling to find it.
    box = await browser.script(
        "const r = document.getElementById('entry-title').getBoundingClientRect();"
        "const v = document.getElementById('entry-value').getBoundingClientRect();"
        "return {top: r.top, bottom: v.bottom, left: r.left, right: r.right,"
        " height: window.innerHeight, width: window.innerWidth}")
    assert box["top"] >= 0 and box["bottom"] <= box["height"], box
    assert box["left"] >= 0 and box["right"] <= box["width"], box
    picked = await browser.script(
        "return Array.from(document.querySelectorAll('#entries tbody tr.picked'),"
        " tr => [tr.cells[0].innerText, tr.getAttribute('aria-selected')])")
    assert picked == [["k00119", "true"]]
    assert json.loads(await browser.text_of("entry-value")) == {"n": 119}
    await browser.screenshot("detail")


async def test_numbers_keep_their_digits_in_a_value_and_its_diff(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set", {"scope": "ids", "key": "i-1", "value": {"n": BIG}})
    # Through a double both are 9007199254740992: the change would vanish from the diff.
    await client.call("state::set", {"scope": "ids", "key": "i-1",
                                     "value": {"n": BIG - 1, "list": [BIG, -BIG]}})
    await browser.open(f"{base}/console/#/keys/ids/i-1")
    history = await browser.wait_text("entry-history", "state:updated")
    assert f"- /n: {BIG}" in history and f"+ /n: {BIG - 1}" in history, history
    assert f"+ /list: [{BIG},{-BIG}]" in history, history
    value = await browser.text_of("entry-value")
    assert json.loads(value) == {"n": BIG - 1, "list": [BIG, -BIG]}, value  # (Python: exact)
    await browser.screenshot("digits")


async def test_a_large_value_is_folded_with_its_size_and_a_download(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    value = [{"line": n, "text": "x" * 40} for n in range(2000)]  # about 100 KB
    size = len(json.dumps(value, separators=(",", ":")))
    await client.call("state::set", {"scope": "docs", "key": "big", "value": value})
    await browser.open(f"{base}/console/#/keys/docs/big")
    fold = await browser.wait_text("entry-fold", "KB")
    assert f"{round(size / 1024)} KB ({size} bytes)" in fold and "download" in fold, fold
    assert len(await browser.text_of("entry-value")) < 5000
    assert await browser.script("return document.body.scrollHeight") < 3000
    downloaded = await browser.script(
        "const a = document.getElementById('entry-download');"
        "return fetch(a.href).then(r => r.text()).then(t => [a.download, t])")
    assert downloaded[0] == "big.json" and json.loads(downloaded[1]) == value
    await browser.screenshot("folded")
    await browser.click_text("entry-fold", "Show all")
    assert json.loads(await browser.text_of("entry-value")) == value


async def test_values_are_searched_through_state_query(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set-many", {"scope": "orders", "entries": [
        {"key": f"o-{n:03d}", "value": {"status": "open" if n % 3 == 0 else "paid",
                                        "ref": f"R{n % 7}-{n}", "total": n}}
        for n in range(30)]})
    await browser.open(f"{base}/console/#/keys/orders")
    await browser.wait_text("page-note", "30 keys on page 1")
    await browser.type("search-pointer", "/status")
    await browser.type("search-value", "open")  # a bare word: the string
    await browser.click_text("search", "Search")
    await browser.wait_text("page-note", "10 matches on page 1")
    rows = await browser.rows("entries")
    assert [r[0] for r in rows] == [f"o-{n:03d}" for n in range(0, 30, 3)]
    assert '"status":"open"' in rows[0][1]
    await browser.screenshot("search")
    await browser.type("search-pointer", "/ref")
    await browser.script("document.getElementById('search-op').value = 'prefix'")
    await browser.type("search-value", '"R2-"')
    await browser.click_text("search", "Search")
    await browser.wait_text("page-note", "4 matches on page 1")
    assert [r[0] for r in await browser.rows("entries")] == ["o-002", "o-009", "o-016", "o-023"]


async def test_edits_in_off_mode_on_a_loopback_bind(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set", {"scope": "orders", "key": "o-1", "value": {"n": 1}})
    await browser.open(f"{base}/console/#/keys/orders/o-1")
    await browser.wait_text("who", "local edits")
    await browser.wait("the write form", lambda d: d.find_element("id", "entry-write").is_displayed())
    await browser.type("write-value", f'{{"n": 5, "id": {BIG}}}')
    await browser.type("write-topic", "edited")
    await browser.type("write-ttl", "600000")
    await browser.click("write-put")
    await browser.wait_text("write-result", "state::set: done")
    entry = await client.call("state::get-entry", {"scope": "orders", "key": "o-1"})
    assert entry["value"] == {"n": 5, "id": BIG} and entry["topic"] == "edited"
    assert entry["expires_at"] is not None
    await browser.type("write-ops", '[{"type": "increment", "path": "n", "by": 2}]')
    await browser.click("write-update")
    await browser.wait_text("write-result", "state::update: done")
    assert await client.call("state::get", {"scope": "orders", "key": "o-1"}) == {"n": 7, "id": BIG}
    await browser.screenshot("edit")
    await browser.click("write-delete")
    await browser.wait_text("write-result", "state::delete: done")
    assert await client.call("state::get", {"scope": "orders", "key": "o-1"}) is None


async def test_refuses_a_write_in_off_mode_bound_to_every_address(
        redis_server: RedisServer, prefix: str, browser: Browser) -> None:
    settings = settings_for(redis_server, prefix, http="0.0.0.0:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=20) as client:
        await client.call("state::set", {"scope": "orders", "key": "o-1", "value": 1})
        port = service.http_address.rsplit(":", 1)[1]
        await browser.open(f"http://127.0.0.1:{port}/console/#/keys/orders/o-1")
        await browser.wait_text("entry-title", "orders / o-1")
        assert await browser.script("return document.getElementById('entry-write').hidden") is True
        assert "off mode: read-only" in await browser.text_of("who")
        # The page's own call, as a write button would send it: refused, nothing written.
        refused = await browser.script(
            "return fetch('/v1/call/state::set', {method: 'POST', headers: "
            "{'X-Stateworker-Console': '1'}, body: JSON.stringify({scope: 'orders', key: 'o-1',"
            " value: 2})}).then(r => r.json())")
        assert refused["error"]["code"] == "PERMISSION_DENIED"
        assert "loopback" in refused["error"]["message"]
        assert await client.call("state::get", {"scope": "orders", "key": "o-1"}) == 1


async def test_refuses_a_write_in_off_mode_behind_a_proxy(redis_server: RedisServer,
                                                          prefix: str) -> None:
    """A loopback bind answering to a public name (a reverse proxy on the same machine passes
    the network's requests on): not local, so the console does not edit."""
    settings = settings_for(redis_server, prefix, http="127.0.0.1:0",
                            http_hosts="state.example.com")
    public = {"Host": "state.example.com", "Origin": "http://state.example.com"}
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=20) as client, \
            httpx.AsyncClient(base_url=f"http://{service.http_address}", headers=public) as http:
        session = (await http.get("/v1/console/session")).json()
        assert (session["local"], session["writes"]) == (False, False)
        write = await http.post("/v1/call/state::set", headers={"X-Stateworker-Console": "1"},
                                content=b'{"scope": "orders", "key": "o-1", "value": 2}')
        assert write.status_code == 403, write.text
        error = write.json()["error"]
        assert error["code"] == "PERMISSION_DENIED" and "loopback names" in error["message"]
        assert await client.call("state::get", {"scope": "orders", "key": "o-1"}) is None
