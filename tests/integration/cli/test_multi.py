"""`stateworker txn` against a running service: ops from stdin or a file (a list, or an object
with compare and else_ops), values kept as written, a failed op named with exit 1 and nothing
written, a table; and malformed files refused with exit 2, nothing sent."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from tests.integration.cli.test_verbs import cli, failed
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_txn_from_stdin_and_from_a_file(service: StateService, client: StateClient,
                                              redis_server: RedisServer, prefix: str,
                                              scope: str, tmp_path: Path) -> None:
    ops = '[{"op":"set","key":"a","value":{"total":12.50}},{"op":"set","key":"b","value":1e2}]'
    done = await cli(redis_server, prefix, "txn", scope, stdin=ops)
    assert done.returncode == 0, done.stderr
    result = msgspec.json.decode(done.stdout)
    assert result["branch"] == "ops" and [r["key"] for r in result["results"]] == ["a", "b"]
    got = await cli(redis_server, prefix, "get", scope, "a")
    assert got.stdout == '{"total":12.50}\n'  # as written
    branch = tmp_path / "tx.json"
    branch.write_text('{"compare":[{"key":"a","expected_version":7}],'
                      '"ops":[{"op":"delete","key":"a"}],'
                      '"else_ops":[{"op":"update","key":"a","ops":'
                      '[{"type":"set","path":"seen","value":true}]}]}')
    table = await cli(redis_server, prefix, "txn", scope, str(branch), "-o", "table")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["OP", "KEY", "VERSION", "OUTCOME"]
    assert table.stdout.splitlines()[1].split() == ["update", "a", "2", "written"]
    assert "(else_ops ran;" in table.stdout
    assert await client.get(scope, "a") == {"total": 12.5, "seen": True}


async def test_a_failed_op_exits_1_and_writes_nothing(service: StateService,
                                                      client: StateClient,
                                                      redis_server: RedisServer, prefix: str,
                                                      scope: str) -> None:
    await client.set(scope, "a", 1)
    ops = '[{"op":"set","key":"b","value":2},{"op":"check","key":"a","expected_version":9}]'
    error = failed(await cli(redis_server, prefix, "txn", scope, stdin=ops), "CONFLICT")
    assert error["details"]["op_index"] == 1 and error["details"]["path"] == "$.ops[1]"
    assert await client.get(scope, "b") is None


async def test_malformed_transactions_exit_2_and_send_nothing(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str,
        tmp_path: Path) -> None:
    for stdin, args, words in (
            ("{oops", [], "must be a JSON list of ops"),
            ('"text"', [], "must be a JSON list of ops"),
            ('{"scope":"other","ops":[]}', [], 'names scope "other"'),
            (None, [str(tmp_path / "missing.json")], "cannot read")):
        done = await cli(redis_server, prefix, "txn", scope, *args, stdin=stdin)
        assert done.returncode == 2, (stdin, done.stdout, done.stderr)
        assert done.stdout == "" and words in done.stderr and "Traceback" not in done.stderr


async def test_query_prints_the_matching_entries_and_the_next_page(
        service: StateService, client: StateClient, redis_server: RedisServer, prefix: str,
        scope: str) -> None:
    for n in range(5):
        await client.set(scope, f"o-{n}", {"status": "open" if n % 2 else "done", "total": n})
    done = await cli(redis_server, prefix, "query", scope, "--where", '/status eq "open"',
                     "--where", "/total gte 1")
    assert done.returncode == 0, done.stderr
    assert [e["key"] for e in msgspec.json.decode(done.stdout)["entries"]] == ["o-1", "o-3"]
    table = await cli(redis_server, prefix, "query", scope, "--where", "/total exists",
                      "--limit", "2", "-o", "table")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KEY", "VERSION", "UPDATED", "VALUE"]
    assert [line.split()[0] for line in lines[1:3]] == ["o-0", "o-1"]
    assert lines[-1].startswith("(more: stateworker query ") and "--after" in lines[-1]
    more = lines[-1].removeprefix("(more: ").removesuffix(")")
    assert "--limit 2 " in more and "--where '/total exists'" in more, more
    bad = await cli(redis_server, prefix, "query", scope, "--where", "/status is open")
    assert bad.returncode == 2 and "OP one of eq" in bad.stderr and bad.stdout == ""
