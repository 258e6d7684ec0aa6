"""Clickjacking: a page of another site frames the console and lays its own bait over it, so
the user's click lands on a console button (here `Delete`, one click, on the key the frame's
address opened). In `off` mode on a loopback bind the console edits without a login, and its
own requests carry its own `Origin`: only the console's refusal to be framed stops it."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from benchmarks.browser import Browser
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient

pytestmark = pytest.mark.anyio


@contextlib.contextmanager
def another_site(page: str) -> Iterator[str]:
    """A web server of another site (`localhost`, not the console's `127.0.0.1`) serving
    `page` at `/`; its URL."""
    body = page.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # (the stdlib's name for a GET)
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def click_delete_in_the_frame(driver: webdriver.Chrome) -> bool:
    """The deceived user's click on the framed console's `Delete`, once the console shows
    the key; False when the frame shows no console to click."""
    driver.switch_to.frame("victim")
    try:
        if not driver.find_elements(By.ID, "write-delete"):
            return False
        wait = WebDriverWait(driver, 10, poll_frequency=0.05)
        wait.until(lambda d: d.find_element(By.ID, "entry-write").is_displayed())
        driver.find_element(By.ID, "write-delete").click()
        wait.until(lambda d: "done" in d.find_element(By.ID, "write-result").text)
        return True
    finally:
        driver.switch_to.default_content()


async def test_a_page_of_another_site_cannot_frame_the_console(
        served: tuple[StateService, StateClient, str], browser: Browser) -> None:
    _, client, base = served
    await client.call("state::set", {"scope": "orders", "key": "o-1", "value": 1})
    bait = (f'<iframe name="victim" src="{base}/console/#/keys/orders/o-1" width="1200" '
            'height="800" onload="document.title = \'framed\'"></iframe>')
    with another_site(bait) as site:
        await browser.open(site)
        await browser.wait("the frame to load", lambda d: d.title == "framed")
        clicked = await browser.run(lambda: click_delete_in_the_frame(browser.driver))
    assert not clicked, "the console rendered inside another site's frame, and its Delete ran"
    assert await client.call("state::get", {"scope": "orders", "key": "o-1"}) == 1
