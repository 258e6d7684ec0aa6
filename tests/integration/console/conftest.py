"""The console's tests share one headless chromium per module (tests/browser.py); each test
starts with no cookies, so a login never leaks into the next."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from benchmarks.browser import Browser
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from tests.integration.services import settings_for
from tests.servers import RedisServer


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    browser = Browser()
    yield browser
    browser.close()


@pytest.fixture
def browser(chromium: Browser) -> Iterator[Browser]:
    yield chromium
    chromium.driver.get("about:blank")  # (a live tail's stream closed before its service stops)
    chromium.driver.delete_all_cookies()


@pytest.fixture
async def served(redis_server: RedisServer, prefix: str
                 ) -> AsyncIterator[tuple[StateService, StateClient, str]]:
    """A service with the HTTP face on, a client of it, and the face's base URL."""
    settings = settings_for(redis_server, prefix, http="127.0.0.1:0")
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=20) as client:
        yield service, client, f"http://{service.http_address}"
