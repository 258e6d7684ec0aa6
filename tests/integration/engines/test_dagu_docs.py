"""docs/dagu.md's example runs as written: the DAG's `run:` steps are taken from the page (not
copied here), each run through `sh -c` with Dagu's `DAG_NAME` set, against the running state
service; each prints the line the page shows after the DAG (`…` stands for any text)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import yaml

from stateworker.app.service import StateService
from tests.docblocks import fenced_blocks, matches
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]


def the_example() -> tuple[dict[str, Any], list[str]]:
    """The page's DAG (the yaml block that calls stateworker) and the json block after it."""
    blocks = fenced_blocks("docs/dagu.md")
    at = next(i for i, (kind, text) in enumerate(blocks)
              if kind == "yaml" and "stateworker call" in text)
    kind, printed = blocks[at + 1]
    assert kind == "json"
    return yaml.safe_load(blocks[at][1]), printed.splitlines()


async def test_the_dagu_example_runs_as_written(service: StateService, redis_server: RedisServer,
                                                prefix: str) -> None:
    dag, expected = the_example()
    steps = dag["steps"]
    assert len(steps) == len(expected)
    env = {**os.environ, "DAG_NAME": dag["name"], "STATEWORKER_REDIS_URL": redis_server.url,
           "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    outputs = []
    for step, want in zip(steps, expected, strict=True):
        with anyio.fail_after(60):
            done = await anyio.run_process(["sh", "-c", step["run"]], env=env, check=False)
        printed = done.stdout.decode().strip()
        assert done.returncode == 0, (step["id"], printed, done.stderr.decode())
        assert matches(want, printed), (step["id"], want, printed)
        outputs.append(msgspec.json.decode(printed))
    diffs = [out["changed"] for out in outputs if out["operation"] == "diff"]
    assert diffs == [True, False]
