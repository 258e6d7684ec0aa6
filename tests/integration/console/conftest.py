"""The console's tests share one headless chromium per module (tests/browser.py); each test
starts with no cookies, so a login never leaks into the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.browser import Browser


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
