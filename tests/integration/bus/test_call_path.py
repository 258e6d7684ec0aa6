"""The way of one bus `state::set` is what docs/architecture.md says it is: the modules
`benchmarks/call_path.py` finds on it, counted by the profiler, are the list in the map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.call_path import modules_on_the_way
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

MAP = Path(__file__).parents[3] / "docs" / "architecture.md"


def documented() -> list[str]:
    found = re.search(r"```call-path\n(.*?)\n```", MAP.read_text(), re.S)
    assert found, "docs/architecture.md has no call-path block"
    return sorted(f"stateworker.{name}" for name in found.group(1).split())


async def test_the_way_of_a_set_is_the_one_the_map_lists(redis_server: RedisServer,
                                                          prefix: str) -> None:
    modules = await modules_on_the_way(redis_server.url, prefix)
    assert "stateworker.state.kv.writes" in modules  # (the profiler saw the plan being built)
    assert modules == documented()
    count = re.search(r"The way of one bus `state::set`, read to reply, is (\d+) package",
                      MAP.read_text())
    assert count and int(count.group(1)) == len(modules)
