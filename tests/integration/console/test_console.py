"""The console in a real headless chromium (`off` mode): it lists a scope's keys, opens a value
with its metadata and its recent changes, shows a write made by another client in the live
tail within 2 s, shows a trigger with its lag, flags a service nobody serves as stalled, shows
the rates of the last minutes at once, and pages through a scope. Each page is saved as
docs/screenshots/<page>.png (test_console_keys.py: the keys view's others).
(The first page of a scope of 100,000 entries is timed in `scripts/bench --sections
console`.)"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from benchmarks.browser import Browser
from stateworker.app.cli.status import status_report, summary
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.errors import StateError
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

async def test_lists_keys_and_opens_a_value_with_metadata_and_changes(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set", {"scope": "orders", "key": "o-1", "value": {"total": 12}})
    await client.call("state::set", {"scope": "orders", "key": "o-1", "topic": "paid",
                                     "value": {"total": 13, "paid": True}},
                      context={"execution_id": "run-7"})
    await client.call("state::set", {"scope": "orders", "key": "o-2", "value": [1, 2]})
    await client.call("state::set", {"scope": "stock", "key": "s-1", "value": 5})

    await browser.open(f"{base}/console/#/keys/orders")
    await browser.wait_text("page-note", "2 keys on page 1")
    rows = await browser.rows("entries")
    assert [r[:3] for r in rows] == [["o-1", "paid", "2"], ["o-2", "-", "1"]]
    assert "stock" in await browser.text_of("scopes")
    await browser.screenshot("keys")

    await browser.click_row("entries", "o-1")
    await browser.wait_text("entry-title", "orders / o-1")
    meta = await browser.wait_text("entry-meta", "run-7")  # updated_by
    for shown in ("version\n2", "topic\npaid", "updated_by\nrun-7"):
        assert shown in meta, (shown, meta)
    assert json.loads(await browser.text_of("entry-value")) == {"total": 13, "paid": True}
    history = await browser.wait_text("entry-history", "state:updated")
    assert "- /total: 12" in history and "+ /total: 13" in history and "+ /paid: true" in history
    assert "state:created" in history
    assert history.count(" · version ") == 2  # o-1's two changes, none of o-2's
    await browser.screenshot("entry")


async def test_live_tail_shows_another_clients_write_within_2_s(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await browser.open(f"{base}/console/#/tail")
    await browser.type("tail-scope", "orders")
    await browser.type("tail-prefix", "live-")
    await browser.click("tail-start")
    await browser.wait_text("tail-state", "watching")
    await client.call("state::set", {"scope": "stock", "key": "live-0", "value": 0})  # scope
    await client.call("state::set", {"scope": "orders", "key": "dead-0", "value": 0})  # prefix
    written = time.monotonic()
    await client.call("state::set", {"scope": "orders", "key": "live-1", "value": {"n": 1}})
    await browser.wait_text("tail-events", "live-1", timeout=2.0)
    print(f"live tail: the write shown {time.monotonic() - written:.3f} s after it was made")
    rows = await browser.rows("tail-events")
    assert [(r[3], r[4], r[5], r[7]) for r in rows] == [("orders", "live-1", "1", '{"n":1}')]
    await browser.screenshot("tail")


async def test_overview_shows_a_trigger_and_its_lag(redis_server: RedisServer, prefix: str,
                                                    browser: Browser) -> None:
    # No dispatcher: the trigger's events wait, so its lag is exactly what was written.
    settings = settings_for(redis_server, prefix, http="127.0.0.1:0", dispatch=False)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=20) as client:
        await client.call("state::register-trigger", {
            "id": "audit", "function_id": "audit::record", "service": "auditor",
            "config": {"scope": "orders"}})
        for n in range(5):
            await client.call("state::set", {"scope": "orders", "key": f"k{n}", "value": n})
        for arrival in ("a", "b"):
            await client.call("state::barrier", {"event": {"key": arrival}, "condition_config": {
                "id": "batch-7", "expect": 3}})
        await browser.open(f"http://{service.http_address}/console/#/overview")
        await browser.wait_text("ov-triggers", "audit::record")
        rows = await browser.rows("ov-triggers")
        assert [r[:5] for r in rows] == [["audit", "audit::record", "auditor", "orders", "5"]]
        assert await browser.rows("ov-barriers") == [["batch-7", "3 arrivals", "2 of 3", "waiting"]]
        # `stateworker status` says the same: its JSON, and its table for people.
        report = await status_report(settings)
        assert report["triggers"] == [{"id": "audit", "function_id": "audit::record",
                                       "service": "auditor", "scope": "orders", "owner": None,
                                       "lag_events": 5, "lag_ms": None, "delivered": 0,
                                       "aside": None, "last_error": None,
                                       "waiting_on": None, "cut_events": 0}]
        rows = [line.split() for line in summary(report).splitlines()]
        assert ["ID", "FUNCTION", "SERVICE", "SCOPE", "LAG", "LAG", "MS", "CALLS", "LAST",
                "ERROR"] in rows
        assert ["audit", "audit::record", "auditor", "orders", "5", "-", "0", "-"] in rows
        await browser.wait_text("ov-services", "state")
        await browser.screenshot("overview")


async def test_flags_a_service_nobody_serves_as_stalled(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::register-trigger", {
        "id": "mail", "function_id": "mailer::send", "service": "mailer",
        "config": {"scope": "orders"}})
    await client.call("state::set", {"scope": "orders", "key": "o-1", "value": 1})
    await browser.open(f"{base}/console/#/overview")
    services = await browser.wait_text("ov-services", "STALLED", timeout=20)
    row = next(r for r in await browser.rows("ov-services") if r[0] == "mailer")
    assert row[1].startswith("STALLED: 1 call(s) wait and no consumer reads"), row
    assert [r[1] for r in await browser.rows("ov-services") if r[0] == "state"] == ["ok"], services
    await browser.wait_text("ov-counters", "handler_calls")  # (flushed once a round)
    counters = {r[0]: r[1] for r in await browser.rows("ov-counters")}
    assert counters["handler_calls"] == "1", counters  # the dispatch's counters as a table
    await browser.screenshot("stalled")


async def test_rates_show_the_last_minutes_at_once(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set", {"scope": "orders", "key": "o-1", "value": 1})
    await browser.open(f"{base}/healthz")  # (the service's origin, no page polling it)
    await browser.wait("three samples of the service's rates", lambda d: d.execute_script(
        "const x = new XMLHttpRequest(); x.open('GET', '/v1/console/overview', false); x.send();"
        "return JSON.parse(x.responseText).rates.length >= 3"), timeout=30)
    await browser.open(f"{base}/console/#/overview")
    # The first render already draws the samples the service kept (not one poll's point).
    await browser.wait_text("ov-rate-text", "calls/s now")
    points = await browser.script("return Number(document.getElementById('ov-rate').dataset.points)")
    assert points >= 2, points
    assert "(last " in await browser.text_of("ov-rate-text")


async def test_pages_through_a_scope(served: tuple[StateService, StateClient, str],
                                    browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set-many", {"scope": "big", "entries": [  # 450 keys: 3 pages
        {"key": f"k{n:05d}", "value": {"n": n}} for n in range(450)]})
    await browser.open(f"{base}/console/#/keys/big")
    await browser.wait_text("page-note", "200 keys on page 1")
    assert [r[0] for r in await browser.rows("entries")] == [f"k{n:05d}" for n in range(200)]
    await browser.click("page-next")
    await browser.wait_text("page-note", "200 keys on page 2")
    await browser.click("page-next")
    await browser.wait_text("page-note", "50 keys on page 3")
    rows = await browser.rows("entries")
    assert [r[0] for r in rows] == [f"k{n:05d}" for n in range(400, 450)]
    assert await browser.script("return document.getElementById('page-next').disabled") is True
    await browser.type("search-prefix", "k0002")
    await browser.click_text("search", "Search")
    await browser.wait_text("page-note", "10 keys on page 1")
    assert (await browser.rows("entries"))[0][0] == "k00020"


async def test_ui_content_serves_the_console_files(
        served: tuple[StateService, StateClient, str]) -> None:
    _, client, base = served
    async with httpx.AsyncClient(base_url=base) as http:
        for path, name, kind in (("state/console.js", "console.js", "text/javascript"),
                                 ("state/console.css", "console.css", "text/css")):
            result = await client.call("state::ui-content", {"path": path})
            served_file = await http.get(f"/console/{name}")
            assert result["content"] == served_file.text
            assert result["content_type"].startswith(kind)
            assert served_file.headers["content-type"] == result["content_type"]
        page = (await http.get("/console/")).text  # the page: its files inlined
        assert "<style>" in page and "<script>" in page and 'src="/console' not in page
    with pytest.raises(StateError) as refused:
        await client.call("state::ui-content", {"path": "state/../../etc/passwd"})
    assert refused.value.code == "NOT_FOUND"
    assert "state/console.js" in str(refused.value)


async def net_out(client: StateClient) -> int:
    """The bytes Redis has sent its clients, since it started."""
    info = await client.conn.execute("INFO", "stats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return int(text.split("total_net_output_bytes:", 1)[1].split()[0])


async def test_a_key_history_reads_a_bounded_number_of_bytes(
        served: tuple[StateService, StateClient, str]) -> None:
    """A history reads its partition's last events in pages, at most HISTORY_BYTES (8 MiB) of
    them, and says when it stopped there: 48 values of 1 MiB before a key's one change are
    not all read (Redis's own count of the bytes it sent) to show that change."""
    _, client, base = served
    big = "v" * (1024 * 1024 - 64)
    for i in range(48):
        await client.call("state::set", {"scope": "orders", "key": f"big{i}", "value": big})
    await client.call("state::set", {"scope": "orders", "key": "small", "value": 1})
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        before = await net_out(client)
        answer = await http.get("/v1/console/history?scope=orders&key=small")
        sent = await net_out(client) - before
        assert answer.status_code == 200, answer.text
        document = answer.json()
        assert [e["key"] for e in document["events"]] == ["small"]
        assert document["stopped_early"] is True and document["scanned"] == 1000
        assert 8 <= document["read"] < 20, document["read"]
        assert sent < 16 * 2**20, f"{sent / 2**20:.0f} MiB read from Redis for one history"
        await client.call("state::set", {"scope": "orders", "key": "small", "value": 2})
        again = (await http.get("/v1/console/history?scope=orders&key=small")).json()
        assert [e["new_value"] for e in again["events"]][:1] == [2]
