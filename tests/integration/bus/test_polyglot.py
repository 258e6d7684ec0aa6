"""A client and a worker in another language (Node.js, tests/node/: written from
docs/bus-protocol.md, with the npm `redis` package) against the real service: calls with
exact values both ways, a retry, deadlines, and a trigger's calls served by the Node worker
(its group, its pending entries first, its replies and acknowledgements). And the doc names
every key, field and duty that code relies on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio as aredis
from anyio.abc import Process

from stateworker import StateClient
from stateworker.app.service import StateService
from tests.integration.busproto import roundtrip, until
from tests.integration.services import settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "tests" / "node"
DOC = ROOT / "docs" / "bus-protocol.md"
TRIGGER_BODY = ["type", "event_type", "scope", "key", "old_value", "new_value", "version",
                "revision", "ts", "ts_ms", "by"]
VALUE = '{"big":9007199254740993,"dec":1.2300,"e":[],"o":{},"z":1,"a":2,"u":"é😀"}'


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    """node, with the npm packages of tests/node installed (by ./scripts/test, else here)."""
    binary = shutil.which("node")
    assert binary is not None, "node is missing: ./scripts/test installs Debian's nodejs and npm"
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True,
                       capture_output=True, timeout=300)
    yield binary


async def run_node(node: str, *args: str) -> dict[str, Any]:
    done = await anyio.run_process([node, str(NODE_DIR / "main.mjs"), *args], check=False)
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


async def test_a_node_client_calls_with_exact_values_retries_and_deadlines(
        node: str, service: StateService, client: StateClient, redis_server: RedisServer,
        prefix: str, scope: str) -> None:
    await client.call_json("state::set", b'{"scope":"%s","key":"from-python","value":%s}' % (
        scope.encode(), VALUE.encode()))
    seen = await run_node(node, "client", redis_server.url, prefix, scope)
    assert seen["set"] is True
    assert seen["get_own"] == seen["get_python"] == VALUE  # exact both ways
    entry = await client.call_json("state::get", b'{"scope":"%s","key":"from-node"}' % (
        scope.encode()))
    assert entry == VALUE.encode()
    assert seen["retry_same"] is True and seen["retry_result"] == (
        '{"old_value":null,"new_value":{"n":1},"version":1}')
    assert seen["counter"] == '{"n":1}'  # applied once
    assert (seen["late"], seen["late_value"]) == ("DEADLINE_EXCEEDED", "null")
    assert seen["nobody"] == "TIMEOUT"


async def test_a_trigger_is_served_by_a_node_worker(
        node: str, service: StateService, client: StateClient, raw: aredis.Redis,
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """Calls dispatched before the worker ever ran are served (the group exists at 0); a
    worker that read them and died serves its own pending entries first when it comes back
    (the same consumer name); each is acknowledged and deleted."""
    target, seen = f"node{uuid.uuid4().hex[:8]}", f"{scope}-seen"
    stream = f"{prefix}:bus:{target}"
    assert (await roundtrip(raw, prefix, "state::register-trigger", {
        "id": f"t-{target}", "function_id": f"{target}::on_event", "service": target,
        "config": {"scope": scope}}))["ok"] is True
    await client.call_json("state::set", b'{"scope":"%s","key":"k1","value":%s}' % (
        scope.encode(), VALUE.encode()), context={"execution_id": "ex-1"})
    await client.call_json("state::set", b'{"scope":"%s","key":"k2","value":[]}' % (
        scope.encode()))
    await until(lambda: _length(raw, stream, 2), 10, "two handler calls on the stream")

    crashed = await run_node(node, "worker", redis_server.url, prefix, target, seen,
                             "--only-read")
    assert crashed["runs"] == {"on_event": 0, "echo": 0}
    pending = await raw.xpending(stream, target)
    assert pending["pending"] == 2  # read by node-1, not answered

    async with await anyio.open_process(
            [node, str(NODE_DIR / "main.mjs"), "worker", redis_server.url, prefix, target,
             seen], env={**os.environ}) as worker:
        try:
            await until(lambda: _stored(client, seen, "k2"), 15, "the handler's writes")
            text = await client.call_json("state::get", b'{"scope":"%s","key":"k1"}' % (
                seen.encode()))
            document = json.loads(text)
            # The handler's body, as the Node worker got it and stored it, text for text.
            assert list(document) == TRIGGER_BODY
            assert (document["type"], document["event_type"], document["scope"],
                    document["key"], document["old_value"], document["version"],
                    document["by"]) == ("state", "state:created", scope, "k1", None, 1, "ex-1")
            assert b'"new_value":' + VALUE.encode() + b',"version":1,' in text
            assert isinstance(document["ts_ms"], int) and document["ts"].endswith("Z")
            await until(lambda: _length(raw, stream, 0), 10, "the calls deleted")
            assert (await raw.xpending(stream, target))["pending"] == 0
            # A call from Python to the Node worker: the exact body back; a retry with the
            # same id is answered from the worker's record, not run again.
            async with StateClient(settings=settings_for(redis_server, prefix),
                                   service=target) as to_node:
                body = VALUE.encode()
                first = await to_node.call_json(f"{target}::echo", body, call_id="echo-1")
                again = await to_node.call_json(f"{target}::echo", body, call_id="echo-1")
            assert first == again == b'{"body":%s,"runs":1}' % body
        finally:
            await _stop(worker)


async def test_a_node_worker_answers_a_trigger_condition(
        node: str, service: StateService, client: StateClient, raw: aredis.Redis,
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    """The condition calls come as the doc says (id `<trigger id>:p<n>:<revision>:condition`,
    a reply list, a deadline); `false` skips the event, `true` lets it through."""
    target, seen = f"node{uuid.uuid4().hex[:8]}", f"{scope}-seen"
    trigger = f"t-{target}"
    async with await anyio.open_process(
            [node, str(NODE_DIR / "main.mjs"), "worker", redis_server.url, prefix, target,
             seen], env={**os.environ}) as worker:
        try:
            assert (await roundtrip(raw, prefix, "state::register-trigger", {
                "id": trigger, "function_id": f"{target}::on_event", "service": target,
                "config": {"scope": scope, "condition_function_id": f"{target}::judge",
                           "condition_timeout_ms": 10_000}}))["ok"] is True
            for key in ("skip-1", "go-1"):
                await client.call_json("state::set", b'{"scope":"%s","key":"%s","value":1}' % (
                    scope.encode(), key.encode()))
            await until(lambda: _stored(client, seen, "go-1"), 15, "the allowed event handled")
            assert not await _stored(client, seen, "skip-1")
        finally:
            out = await _stop(worker)
    revisions = [json.loads(await client.call_json(
        "state::get-entry", b'{"scope":"%s","key":"%s"}' % (scope.encode(), key)))["revision"]
        for key in (b"skip-1", b"go-1")]
    partition = service.state.keys.partition_of(scope)
    assert out["conditions"] == [f"{trigger}:p{partition}:{revision}:condition"
                                 for revision in revisions]
    assert out["runs"]["on_event"] == 1


async def test_a_node_worker_serves_every_shard_of_a_3_shard_service(
        node: str, redis_server: RedisServer, raw: aredis.Redis, prefix: str,
        scope: str) -> None:
    """STATEWORKER_BUS_SHARDS=3 for the service and the Node worker: a trigger's calls for
    scopes of every partition land on all three shards (by the documented rule), and the
    worker, written from the doc, serves each (its group, reads, acknowledgements)."""
    target, seen = f"node{uuid.uuid4().hex[:8]}", f"{scope}-seen"
    settings = settings_for(redis_server, prefix, bus_shards=3)
    scopes = [f"{scope}-{i}" for i in range(12)]
    streams = [f"{prefix}:bus:{target}"] + [f"{prefix}:bus:{target}:{{{prefix}:p{i}}}"
                                            for i in (1, 2)]
    async with StateService.running(settings), StateClient(settings=settings) as client, \
            await anyio.open_process(
                [node, str(NODE_DIR / "main.mjs"), "worker", redis_server.url, prefix, target,
                 seen], env={**os.environ, "STATEWORKER_BUS_SHARDS": "3"}) as worker:
        try:
            for n, each in enumerate(scopes):  # (not the worker's own writes to `seen`)
                await client.call("state::register-trigger", {
                    "id": f"t-{target}-{n}", "function_id": f"{target}::on_event",
                    "service": target, "config": {"scope": each}})
            for n, each in enumerate(scopes):
                await client.set(each, f"k{n}", n)
            for n in range(len(scopes)):  # (the shards are served in no order among them)
                await until(lambda n=n: _stored(client, seen, f"k{n}"), 15, f"k{n} handled")
            for stream in streams:
                await until(lambda s=stream: _length(raw, s, 0), 10, f"{stream} drained")
                assert (await raw.xpending(stream, target))["pending"] == 0
        finally:
            out = await _stop(worker)
    assert out["runs"]["on_event"] == len(scopes)
    added = [int((await raw.xinfo_stream(s))["entries-added"]) for s in streams]
    assert sum(added) == len(scopes) and all(added), added


async def test_the_doc_names_every_key_field_and_duty_the_node_code_uses() -> None:
    doc = _code(DOC.read_text())
    code = (NODE_DIR / "busproto.mjs").read_text() + (NODE_DIR / "main.mjs").read_text()
    used = [
        # names
        ":bus:", ":reply:", ":done:{", "deadline_ms",
        # the call entry's fields and the reply document's members
        '"id"', '"fn"', '"body"', '"reply"', '"ok"', '"result"', '"error"', "code", "message",
        "details",
        # a worker's duties, a client's commands
        "XADD", "XGROUP", "CREATE", "MKSTREAM", "BUSYGROUP", "XREADGROUP", "XAUTOCLAIM",
        "XACK", "XDEL", "LPUSH", "PEXPIRE", "BLMPOP", "GET", "SET", "PX",
        # the codes it answers or meets
        "DEADLINE_EXCEEDED", "UNKNOWN_FUNCTION", "CALL_ID_REUSED", "INTERNAL", "TIMEOUT",
        # the functions it calls
        "state::set", "state::get", "state::update",
    ]
    for name in used:
        bare = name.strip('"')
        assert bare in code, f"{name} is no longer used by tests/node: drop it from this list"
        assert bare in doc, f"docs/bus-protocol.md does not name {name} (in a code span)"
    # The trigger call's body, every member test_a_trigger_is_served_by_a_node_worker sees.
    for member in TRIGGER_BODY:
        assert f"`{member}`" in DOC.read_text(), f"docs/bus-protocol.md lacks `{member}`"


def _code(markdown: str) -> str:
    """The code of a Markdown text: its fenced blocks and its `code spans`."""
    fenced = re.findall(r"```[^\n]*\n(.*?)```", markdown, re.S)
    prose = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return "\n".join(fenced + re.findall(r"`([^`]+)`", prose))


async def _length(raw: aredis.Redis, stream: str, count: int) -> bool:
    return int(await raw.xlen(stream)) == count


async def _stored(client: StateClient, scope: str, key: str) -> bool:
    return await client.call_json(
        "state::get", b'{"scope":"%s","key":"%s"}' % (scope.encode(), key.encode())) != b"null"


async def _stop(worker: Process) -> dict[str, Any]:
    """SIGTERM the Node worker; what it printed at its end."""
    worker.terminate()
    assert worker.stdout is not None
    with anyio.fail_after(10):
        printed = b"".join([chunk async for chunk in worker.stdout])
        code = await worker.wait()
    assert code == 0, printed
    result: dict[str, Any] = json.loads(printed.decode().splitlines()[-1])
    return result
