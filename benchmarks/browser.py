"""A real headless browser for the console's tests and its benchmark: Debian's chromium driven
by its chromedriver through Selenium (scripts/test and scripts/bench install both). Selenium
blocks, and the service under test may run on the caller's own event loop, so every browser
step runs in a worker thread (`anyio.to_thread`): the loop goes on serving the page's
requests meanwhile."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

T = TypeVar("T")
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
# The flags the machine's own check runs chromium with: no sandbox as root, and nothing that
# reaches out to the network (the closed network refuses it, many connections at a time).
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,900")


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    assert browser and driver, "chromium and chromium-driver are not installed (scripts/test installs them)"
    return browser, driver


class Browser:
    """One chromium; its steps are async (each in a thread)."""

    def __init__(self) -> None:
        browser, driver = chromium_paths()
        self.profile = tempfile.mkdtemp(prefix="sw-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in (*FLAGS, f"--user-data-dir={self.profile}"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=driver))

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def run(self, step: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(step)

    async def open(self, url: str) -> None:
        await self.run(lambda: self.driver.get(url))

    async def wait(self, what: str, holds: Callable[[webdriver.Chrome], Any],
                   timeout: float = 10) -> Any:
        """`holds(driver)`'s first truthy value, polled by Selenium; fails naming `what`."""
        wait = WebDriverWait(self.driver, timeout, poll_frequency=0.05,
                             ignored_exceptions=(StaleElementReferenceException,))
        return await self.run(lambda: wait.until(holds, f"timed out waiting for {what}"))

    async def text_of(self, element_id: str) -> str:
        return await self.run(lambda: self.driver.find_element(By.ID, element_id).text)

    async def wait_text(self, element_id: str, part: str, timeout: float = 10) -> str:
        """The element's text once it contains `part`."""
        def found(driver: webdriver.Chrome) -> str | None:
            text: str = driver.find_element(By.ID, element_id).text
            return text if part in text else None
        result: str = await self.wait(f"{part!r} in #{element_id}", found, timeout)
        return result

    async def rows(self, table_id: str) -> list[list[str]]:
        """The cells' texts of a table's body rows (read by one script: a WebDriver round
        trip per cell costs seconds for a page of keys)."""
        rows: list[list[str]] = await self.script(
            f"return Array.from(document.querySelectorAll('#{table_id} tbody tr'), "
            "row => Array.from(row.cells, cell => cell.innerText))")
        return rows

    async def click(self, element_id: str) -> None:
        await self.run(lambda: self.driver.find_element(By.ID, element_id).click())

    async def click_row(self, table_id: str, first_cell: str) -> None:
        await self._click_first(f"#{table_id} tbody tr", first_cell, f"no row {first_cell!r} in "
                                f"#{table_id}", lambda row: row.find_element(By.TAG_NAME, "td"))

    async def click_text(self, parent_id: str, text: str) -> None:
        """Click the button of `#parent_id` that reads `text`."""
        await self._click_first(f"#{parent_id} button", text,
                                f"no button {text!r} in #{parent_id}", lambda button: button)

    async def _click_first(self, selector: str, text: str, missing: str,
                           label: Callable[[WebElement], WebElement]) -> None:
        """Click the first element of `selector` whose `label` reads `text`."""
        def click() -> None:
            for element in self.driver.find_elements(By.CSS_SELECTOR, selector):
                if label(element).text == text:
                    element.click()
                    return
            raise AssertionError(missing)
        await self.run(click)

    async def type(self, element_id: str, text: str) -> None:
        def typed() -> None:
            field: WebElement = self.driver.find_element(By.ID, element_id)
            field.clear()
            field.send_keys(text)
        await self.run(typed)

    async def script(self, code: str) -> Any:
        return await self.run(lambda: self.driver.execute_script(code))

    async def screenshot(self, name: str) -> Path:
        """The page as docs/screenshots/<name>.png (the README shows them)."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        await self.run(lambda: self.driver.save_screenshot(str(path)))
        return path
