"""The console's first page (`scripts/bench --sections console`; issue 25, must show 5): a
`stateworker serve --http` with a scope of 100,000 entries, and the console opened on it in a
real headless chromium (benchmarks/browser.py). The page times itself: from the navigation's
start to the first 100 keys shown (`performance.now()`, `data-first-keys-ms`). Each round
opens it afresh, alternated with the same page on a scope of 100 entries, so both see the
same machine; the figures are the medians. Target: under 300 ms (not asserted anywhere)."""

from __future__ import annotations

import statistics
from typing import Any

import anyio

from benchmarks.bench_http import serve
from benchmarks.browser import Browser
from stateworker.bus.client import StateClient
from stateworker.settings import Settings

PREFIX = "benchconsole"
ENTRIES = 100_000
BULK = 1000  # entries per state::set-many
VALUE = {"status": "open", "total": 12.5, "customer": "c-1042", "items": [1, 2, 3],
         "note": "a value of about two hundred bytes, as the memory figures use" + "." * 60}


async def fill(client: StateClient, scope: str, count: int) -> None:
    """`count` entries in `scope`, 8 bulk calls in flight."""
    limit = anyio.Semaphore(8)

    async def one(start: int) -> None:
        async with limit:
            await client.call("state::set-many", {"scope": scope, "entries": [
                {"key": f"k{n:06d}", "value": VALUE} for n in range(start, min(start + BULK, count))]})

    async with anyio.create_task_group() as tg:
        for start in range(0, count, BULK):
            tg.start_soon(one, start)


async def first_page_ms(browser: Browser, url: str) -> float:
    """One fresh load of the console on a scope: ms from navigation start to its keys."""
    await browser.open("about:blank")
    await browser.open(url)
    shown = await browser.wait(f"the first page of {url}", lambda d: d.execute_script(
        "return document.body.dataset.firstKeysMs"), timeout=30)
    return float(shown)


async def console_section(url: str, rounds: int, out: Any) -> dict[str, Any]:
    process, line = serve(url, PREFIX, http=True)
    browser = await anyio.to_thread.run_sync(Browser)
    times: dict[str, list[float]] = {"big": [], "small": []}
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIX)) as client:
            await fill(client, "big", ENTRIES)
            await fill(client, "small", 100)
        base = f"http://{line['http']}/console/#/keys/"
        await first_page_ms(browser, base + "small")  # (the browser's own first start)
        for _ in range(max(rounds, 5)):
            times["big"].append(await first_page_ms(browser, base + "big"))
            times["small"].append(await first_page_ms(browser, base + "small"))
    finally:
        await anyio.to_thread.run_sync(browser.close)
        process.terminate()
        process.wait(timeout=30)
    figures: dict[str, Any] = {f"{name}_ms": round(statistics.median(values), 1)
                               for name, values in times.items()}
    figures["big_vs_small"] = round(figures["big_ms"] / figures["small_ms"], 3)
    print(f"\n{'console (issue 25)':<46}{'ours':>9}  {'reference':<34}{'ref':>9}{'ratio':>7}"
          f"  target", file=out)
    print(f"{'first page, scope of 100,000 entries, ms':<46}{figures['big_ms']:>9}  "
          f"{'the same, scope of 100 entries':<34}{figures['small_ms']:>9}"
          f"{figures['big_vs_small']:>7.2f}  < 300 ms", file=out)
    return figures
