"""The `call` command: a Worker's service, --help and its usage errors, and no Redis at the
URL (one line, UNAVAILABLE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from tests.integration.services import run_cli, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_cli_calls_a_workers_service(redis_server: RedisServer, prefix: str) -> None:
    worker = Worker("orders", settings=settings_for(redis_server, prefix),
                    options=BusOptions(block_ms=50))

    @worker.function("orders::create")
    async def create(body: Any, call: Call) -> Any:
        return {"created": body["id"]}

    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        done = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call",
                                              "--service", "orders", "orders::create",
                                              '{"id": "o-7"}')
        worker.stop()
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout) == {"created": "o-7"}


async def test_cli_call_help_and_usage_errors(redis_server: RedisServer, prefix: str) -> None:
    shown = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call", "--help")
    assert shown.returncode == 0
    for text in ("fn", "body", "--timeout", "--service", "exit status", "0 ", "1 ", "2 ",
                 "deadline"):
        assert text in shown.stdout, text
    bad_url = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "--redis-url",
                                             "http://x", "call", "state::get", "{}")
    assert bad_url.returncode == 2
    assert bad_url.stderr.count("\n") == 1 and "Traceback" not in bad_url.stderr
    assert 'unsupported Redis URL scheme "http"' in bad_url.stderr
    bad_timeout = await anyio.to_thread.run_sync(run_cli, redis_server, prefix, "call",
                                                 "--timeout", "-1", "state::get", "{}")
    assert bad_timeout.returncode == 2 and "--timeout" in bad_timeout.stderr


async def test_cli_call_without_redis_is_one_line_unavailable(prefix: str) -> None:
    server = RedisServer(Path("/nonexistent"))  # a free port, nothing listening
    done = await anyio.to_thread.run_sync(run_cli, server, prefix, "call", "--timeout", "0.3",
                                          "state::get", "{}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    error = msgspec.json.decode(done.stderr)
    assert error["code"] == "UNAVAILABLE" and server.url in error["message"]
