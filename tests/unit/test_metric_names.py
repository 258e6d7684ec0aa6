"""The names /metrics shows follow Prometheus's conventions (docs/http.md's table lists every
family: tests/integration/http/test_metrics.py): snake_case, a counter ends in `_total`, a
histogram names its unit; and every counter the dispatchers keep is a family of its own."""

from __future__ import annotations

import re
from pathlib import Path

from stateworker.reactive.status import COUNTERS

ROOT = Path(__file__).parents[2]
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def documented() -> list[tuple[str, str]]:
    """(name, type) of each family in docs/http.md's table of metrics."""
    text = (ROOT / "docs" / "http.md").read_text()
    rows = []
    for line in text.split("## Metrics", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows += [(name, cells[1]) for name in re.findall(r"`([^`]+)`", cells[0])]
    return rows


def test_the_documented_names_follow_the_conventions() -> None:
    rows = documented()
    assert len(rows) > 30
    for name, kind in rows:
        assert NAME.match(name), name
        if kind == "counter":
            assert name.endswith("_total"), name
        elif kind == "gauge":
            assert not name.endswith("_total"), name
        elif kind == "histogram":
            assert name.endswith("_seconds"), name


def test_every_dispatch_counter_is_a_family() -> None:
    """A counter the dispatchers add (`counts.add("<name>")`) is a family of /metrics: in
    COUNTERS, which app/metrics.py shows, and in docs/http.md's table."""
    sources = (ROOT / "stateworker" / "reactive").glob("*.py")
    added = {name for path in sources
             for name in re.findall(r'counts\.add\("([a-z_]+)"', path.read_text())}
    assert added and added <= set(COUNTERS)
    names = {name for name, _ in documented()}
    assert {f"stateworker_dispatch_{name}_total" for name in COUNTERS} <= names
