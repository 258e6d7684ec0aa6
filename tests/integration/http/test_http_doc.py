"""docs/http.md as written: its curl sessions run against a service with the HTTP face on
(the documented address swapped for the one it listens on), each printing what the page
shows; its status table is error_codes.HTTP_STATUS."""

from __future__ import annotations

import re

import anyio
import pytest

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.error_codes import HTTP_STATUS
from stateworker.settings import Settings
from tests.docblocks import ROOT, blocks_of, matches, session
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

DOC = "docs/http.md"
DOCUMENTED = "http://127.0.0.1:8080"


async def test_the_curl_sessions_print_what_the_page_shows(redis_server: RedisServer,
                                                           prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0")
    ran = 0
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        for block in blocks_of(DOC, "console"):
            for command, expected in session(block):
                live = command.replace(DOCUMENTED, f"http://{service.http_address}")
                with anyio.fail_after(30):  # (the service runs on this loop: not blocked)
                    done = await anyio.run_process(["bash", "-c", live], cwd=ROOT, check=False)
                assert done.returncode == 0, (command, done.stderr)
                printed = done.stdout.decode().splitlines()
                assert len(printed) == len(expected), (command, printed)
                for want, got in zip(expected, printed, strict=True):
                    assert matches(want, got), (command, want, got)
                ran += 1
    assert ran >= 8


def test_the_status_table_is_the_one_the_service_uses() -> None:
    text = (ROOT / DOC).read_text()
    table = text[text.index("| status | codes |"):]
    documented = {code: int(status)
                  for status, codes in re.findall(r"^\| (\d{3}) \| (.*) \|$", table, re.M)
                  for code in re.findall(r"`([^`]+)`", codes)}
    assert documented == HTTP_STATUS
