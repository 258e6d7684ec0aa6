"""The `stateworker` command through a real terminal (a pty), as a person runs it: tables on a
terminal and JSON when piped, `--version`, every subcommand's `--help` with its exit statuses
(the parser's tree is walked, so a new subcommand is held to it), and the completion scripts
generated from that tree, bash's completing a subcommand's name."""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata

import anyio
import msgspec
import pytest

from stateworker.app.cli import parser
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from tests.integration.services import run_cli, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

READ_LIMIT_S = 60.0  # a bound on a hang, not a measure of speed


def in_terminal(server: RedisServer, prefix: str, *args: str) -> tuple[int, str]:
    """Run `stateworker --redis-url <server> ARGS` with a pty as its stdin, stdout and
    stderr; its exit status and all it wrote (line ends as written: "\\n")."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "stateworker", "--redis-url", server.url, *args],
        stdin=slave, stdout=slave, stderr=slave, close_fds=True,
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4",
             "COLUMNS": "100"})
    os.close(slave)
    chunks = []
    end = time.monotonic() + READ_LIMIT_S
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(end - time.monotonic(), 0))
            assert ready, f"stateworker {args} wrote nothing more for {READ_LIMIT_S} s: {chunks}"
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal's last end
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return process.wait(timeout=READ_LIMIT_S), b"".join(chunks).decode().replace("\r\n", "\n")


def subcommands(tree: argparse.ArgumentParser, path: tuple[str, ...] = ()
                ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every subcommand of the tree (nested ones too) with its parser."""
    for action in tree._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from subcommands(sub, (*path, name))


SUBCOMMANDS = dict(subcommands(parser.build()))


def test_version_is_the_installed_one(redis_server: RedisServer, prefix: str) -> None:
    status, shown = in_terminal(redis_server, prefix, "--version")
    assert status == 0
    assert shown.strip() == f"stateworker {metadata.version('stateworker')}"


def test_top_level_help_lists_every_subcommand_with_a_line(redis_server: RedisServer,
                                                           prefix: str) -> None:
    status, shown = in_terminal(redis_server, prefix, "--help")
    assert status == 0 and "exit status:" in shown
    listed = {line.split()[0]: line for line in shown.splitlines()
              if line.startswith("    ") and line.split()}
    for path in SUBCOMMANDS:
        if len(path) == 1:
            assert path[0] in listed, path
            assert len(listed[path[0]].split()) > 1, f"{path[0]} has no line of help"


@pytest.mark.parametrize("path", list(SUBCOMMANDS), ids=" ".join)
def test_every_subcommand_help_has_a_description_options_and_exit_statuses(
        redis_server: RedisServer, prefix: str, path: tuple[str, ...]) -> None:
    status, shown = in_terminal(redis_server, prefix, *path, "--help")
    assert status == 0, shown
    usage, _, rest = shown.partition("\n\n")
    assert usage.startswith("usage: stateworker " + " ".join(path)), usage
    assert rest.split("\n")[0].strip(), f"{path}: no description"
    statuses = shown[shown.index("exit status:"):]
    for code in ("0", "2"):
        assert f"\n  {code}  " in statuses, (path, code, statuses)
    for action in SUBCOMMANDS[path]._actions:
        assert action.help, (path, action.dest, "an option without help")


@pytest.mark.parametrize("command", [("status",), ("ls", "SCOPE"), ("list-triggers",),
                                     ("principal", "list")], ids=" ".join)
async def test_a_table_on_a_terminal_json_when_piped(redis_server: RedisServer, prefix: str,
                                                     command: tuple[str, ...]) -> None:
    settings = settings_for(redis_server, prefix)
    scope = f"orders-{prefix}"
    args = tuple(scope if word == "SCOPE" else word for word in command)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings) as client:
        await client.set(scope, "o-1", {"total": 12.50})
        await client.call("state::register-trigger", {
            "id": f"t-{prefix}", "function_id": "audit::seen", "service": "audit",
            "config": {"scope": scope}})
        status, table = await anyio.to_thread.run_sync(
            lambda: in_terminal(redis_server, prefix, *args))
        piped = await anyio.to_thread.run_sync(lambda: run_cli(redis_server, prefix, *args))
        forced = await anyio.to_thread.run_sync(
            lambda: in_terminal(redis_server, prefix, *args, "--output", "json"))
    assert status == 0, table
    assert not table.lstrip().startswith("{"), table
    # (status: the dispatch line's partitions collapsed into one; its lag is whatever the
    # dispatcher has not passed yet when status reads it)
    expected = {"status": "4 partitions, lag ", "ls": "KEY  VERSION  UPDATED",
                "list-triggers": "ID", "principal": "NAME  ROLES"}[command[0]]
    assert expected in table, table
    assert piped.returncode == 0, piped.stderr
    document = msgspec.json.decode(piped.stdout)
    assert isinstance(document, dict)
    assert msgspec.json.decode(forced[1]).keys() == document.keys()
    if command[0] == "ls":
        assert "o-1" in table and [e["key"] for e in document["entries"]] == ["o-1"]
    if command[0] == "list-triggers":
        assert f"t-{prefix}" in table
        assert [t["id"] for t in document["triggers"]] == [f"t-{prefix}"]
    if command[0] == "status":
        assert document["reachable"] is True and len(document["dispatch"]["partitions"]) == 4


def test_completion_scripts_are_generated_and_bash_completes_a_subcommand(
        redis_server: RedisServer, prefix: str) -> None:
    status, bash = in_terminal(redis_server, prefix, "completion", "bash")
    assert status == 0 and "complete -o default -F _stateworker stateworker" in bash
    status, zsh = in_terminal(redis_server, prefix, "completion", "zsh")
    assert status == 0 and zsh.startswith("#compdef stateworker")
    for path in SUBCOMMANDS:
        assert path[-1] in bash and path[-1] in zsh, path

    def complete(*words: str) -> list[str]:
        script = (f"source <({sys.executable} -m stateworker completion bash)\n"
                  f"COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}\n"
                  '_stateworker; printf "%s\\n" "${COMPREPLY[@]}"\n')
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=READ_LIMIT_S, check=True)
        return done.stdout.split()

    assert complete("stateworker", "sta") == ["status"]
    assert complete("stateworker", "principal", "l") == ["list"]
    assert complete("stateworker", "ls", "orders", "--output", "") == ["json", "table"]
    assert complete("stateworker", "completion", "z") == ["zsh"]
    assert "--progress" in complete("stateworker", "watch", "--pro")


@pytest.mark.parametrize(("args", "says"), [
    ([b"put", b"orders", b"\xff", b"1"], "argument 3 is not valid UTF-8 text"),
    ([b"--redis-url", b"redis://127.0.0.1:99999/0", b"get", b"orders", b"k"],
     "Port out of range 0-65535"),
    ([b"--redis-url", b"redis://\xff/0", b"status"], "argument 2 is not valid UTF-8 text"),
    ([b"get", b"--timeout", b"1e308", b"orders", b"k"], "at most 31622400 s (a year)"),
    ([b"call", b"--service", b"a/b", b"x::y"], "a service name contains '/'"),
    ([b"--redis-url", b"notaurl", b"get", b"orders", b"k"], '"notaurl" is not a Redis URL'),
    ([b"call", b"--service", b"s" * 65, b"x::y"], "is 65 bytes, more than the limit of 64"),
])
def test_bad_usage_is_one_line_and_status_2(args: list[bytes], says: str) -> None:
    """What argv can hold that no command takes (bytes that are no UTF-8, a port past 65535,
    a timeout no deadline holds): exit status 2 and one line naming it, no traceback."""
    done = subprocess.run([sys.executable.encode(), b"-m", b"stateworker", *args],
                          capture_output=True, timeout=60, check=False)
    error = done.stderr.decode(errors="replace")
    assert done.returncode == 2, error
    assert says in error and "Traceback" not in error, error
