"""The short verbs against a running service (`get`, `put`, `del`, `ls`), `watch SCOPE`
with `--prefix` and `--progress`, and a call to a service that nothing serves (UNAVAILABLE
at once, not sent)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import IO, Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.keys import bus_stream
from tests.integration.services import run_cli
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def cli(server: RedisServer, prefix: str, *args: str,
              stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if stdin is None:
        return await anyio.to_thread.run_sync(lambda: run_cli(server, prefix, *args))
    return await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "stateworker", "--redis-url", server.url, *args], input=stdin,
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"},
        capture_output=True, text=True, timeout=60, check=False))


def failed(done: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    assert done.returncode == 1, (done.stdout, done.stderr)
    error: dict[str, Any] = msgspec.json.decode(done.stderr)
    assert error["code"] == code, error
    return error


async def test_put_get_del_keep_values_exactly(service: StateService, client: StateClient,
                                              redis_server: RedisServer, prefix: str,
                                              scope: str) -> None:
    put = await cli(redis_server, prefix, "put", scope, "o-1", '{"total": 12.50, "n": 1e2}')
    assert put.returncode == 0, put.stderr
    assert msgspec.json.decode(put.stdout)["created"] is True
    got = await cli(redis_server, prefix, "get", scope, "o-1")
    assert got.returncode == 0 and got.stdout == '{"total":12.50,"n":1e2}\n'
    assert await client.get(scope, "o-1") == {"total": 12.5, "n": 100.0}
    piped = await cli(redis_server, prefix, "put", scope, "s", "-", stdin='"hello"\n')
    assert piped.returncode == 0, piped.stderr
    assert await client.get(scope, "s") == "hello"
    deleted = await cli(redis_server, prefix, "del", scope, "o-1")
    assert deleted.returncode == 0 and deleted.stdout == '{"total":12.50,"n":1e2}\n'
    again = await cli(redis_server, prefix, "del", scope, "o-1")
    assert again.returncode == 0 and again.stdout == "null\n"
    missing = failed(await cli(redis_server, prefix, "get", scope, "o-1"), "NOT_FOUND")
    assert missing["details"] == {"scope": scope, "key": "o-1"}


async def test_put_of_text_that_is_not_json_exits_2_and_sends_nothing(
        service: StateService, client: StateClient, redis_server: RedisServer, prefix: str,
        scope: str) -> None:
    for value, stdin, where in (("hello", None, "VALUE"), ("-", "{oops", "stdin")):
        done = await cli(redis_server, prefix, "put", scope, "k", value, stdin=stdin)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"{where} must be one JSON value" in done.stderr
        assert '"hello"' in done.stderr or '"{oops"' in done.stderr  # the value, as JSON text
    for value, stdin, reason in (('"\\ud800"', None, "holds a lone UTF-16 surrogate"),
                                 ("", None, "it is empty"), ("-", "", "it is empty")):
        done = await cli(redis_server, prefix, "put", scope, "k", value, stdin=stdin)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert reason in done.stderr and "truncated" not in done.stderr, done.stderr
    assert await client.get(scope, "k") is None


async def test_ls_pages_with_limit_and_after(service: StateService, client: StateClient,
                                            redis_server: RedisServer, prefix: str,
                                            scope: str) -> None:
    for key in ("a-1", "a-2", "a-3", "b-1"):
        await client.set(scope, key, key)
    first = await cli(redis_server, prefix, "ls", scope, "--prefix", "a-", "--limit", "2")
    assert first.returncode == 0, first.stderr
    page = msgspec.json.decode(first.stdout)
    assert [e["key"] for e in page["entries"]] == ["a-1", "a-2"]
    assert "value" not in page["entries"][0]
    rest = await cli(redis_server, prefix, "ls", scope, "--prefix", "a-", "--limit", "2",
                     "--after", page["next_after"], "--values")
    entries = msgspec.json.decode(rest.stdout)["entries"]
    assert [(e["key"], e["value"]) for e in entries] == [("a-3", "a-3")]
    table = await cli(redis_server, prefix, "ls", scope, "--limit", "3", "-o", "table")
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KEY", "VERSION", "UPDATED", "TOPIC"]
    assert [line.split()[0] for line in lines[1:4]] == ["a-1", "a-2", "a-3"]
    more = lines[4].removeprefix("(more: ").removesuffix(")").split()
    assert more[:6] == ["stateworker", "ls", scope, "--limit", "3", "--after"], lines[4]
    last = await cli(redis_server, prefix, *more[1:])  # the command it prints, as printed
    assert [e["key"] for e in msgspec.json.decode(last.stdout)["entries"]] == ["b-1"]
    # the next page of a filtered listing is the same listing's: prefix, limit, values kept
    table = await cli(redis_server, prefix, "ls", scope, "--prefix", "a-", "--limit", "1",
                      "--values", "-o", "table")
    more = table.stdout.splitlines()[-1].removeprefix("(more: ").removesuffix(")").split()
    after = await cli(redis_server, prefix, *more[1:])
    assert [(e["key"], e["value"]) for e in msgspec.json.decode(after.stdout)["entries"]] == [
        ("a-2", "a-2")]
    bad = await cli(redis_server, prefix, "ls", scope, "--limit", "0")
    assert bad.returncode == 2 and "--limit" in bad.stderr and "got \"0\"" in bad.stderr


async def test_call_to_a_service_nothing_serves_is_unavailable_at_once(
        redis_server: RedisServer, raw: aredis.Redis, prefix: str) -> None:
    done = await cli(redis_server, prefix, "call", "--timeout", "30", "--service", "nobody",
                     "nobody::work", "{}")
    error = failed(done, "UNAVAILABLE")
    stream = bus_stream(prefix, "nobody")
    assert f"no consumer group reads {stream}" in error["message"]
    assert 'Worker("nobody").serve()' in error["message"]  # how to start one
    assert error["details"] == {"stream": stream, "service": "nobody", "sent": False}
    assert await raw.exists(stream) == 0  # not sent
    state = failed(await cli(redis_server, prefix, "get", "orders", "o-1"), "UNAVAILABLE")
    assert "./scripts/run" in state["message"]  # no `stateworker serve` ever ran here


class Lines:
    """A `stateworker watch` process's stdout, read line by line within a bound."""

    def __init__(self, redis_server: RedisServer, prefix: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stateworker", "--redis-url", redis_server.url, "watch",
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
                 "STATEWORKER_WATCH_PROGRESS_S": "0.2"})
        self.seen: list[dict[str, Any]] = []

    async def until(self, done: Any) -> None:
        """Read lines until `done(self.seen)` holds (within 30 s)."""
        out: IO[bytes] | None = self.process.stdout
        assert out is not None
        with anyio.fail_after(30):
            while not done(self.seen):
                line = await anyio.to_thread.run_sync(out.readline, abandon_on_cancel=True)
                assert line, self.process.stderr.read() if self.process.stderr else ""
                self.seen.append(msgspec.json.decode(line))

    def stop(self) -> int:
        self.process.terminate()
        status = self.process.wait(timeout=30)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()
        return status


def keys(seen: list[dict[str, Any]]) -> list[str]:
    return [item["key"] for item in seen if item["type"] == "state"]


async def test_watch_scope_prefix_and_bookmarks_only_with_progress(
        service: StateService, client: StateClient, redis_server: RedisServer, prefix: str,
        scope: str) -> None:
    await client.set(scope, "m", 0)  # the watches start from here, however late they start
    start = (await client.call("state::get-entry", {"scope": scope, "key": "m"}))["revision"]
    plain = Lines(redis_server, prefix, scope, "--prefix", "o-", "--from", start)
    progress: Lines | None = None
    try:
        await client.set(scope, "o-0", 0)
        await client.set(scope, "x-1", 1)  # not under the prefix
        await client.set(scope, "o-1", 1)
        await plain.until(lambda seen: keys(seen)[-1:] == ["o-1"])
        # Started once the plain watch has o-1: its two bookmarks after o-1 are two quiet
        # times after the plain watch's last event, so that one got bookmarks too.
        progress = Lines(redis_server, prefix, "--scope", scope, "--progress", "--from", start)
        await progress.until(lambda seen: keys(seen) == ["o-0", "x-1", "o-1"]
                             and [i["type"] for i in seen[-2:]] == ["bookmark"] * 2)
        await client.set(scope, "o-2", 2)
        await plain.until(lambda seen: keys(seen)[-1:] == ["o-2"])
    finally:
        assert plain.stop() == 0 and (progress is None or progress.stop() == 0)
    assert [item["type"] for item in plain.seen] == ["state"] * 3  # no bookmark
    assert keys(plain.seen) == ["o-0", "o-1", "o-2"]
    assert progress.seen[-1]["revision"] == progress.seen[2]["revision"]  # o-1's: all passed


async def test_watch_scope_given_twice_differently_is_a_usage_error(
        redis_server: RedisServer, prefix: str) -> None:
    done = await cli(redis_server, prefix, "watch", "orders", "--scope", "other")
    assert done.returncode == 2
    assert done.stderr.strip() == ('stateworker: watch: scope given twice, as "orders" and '
                                   '--scope "other": give it once')
