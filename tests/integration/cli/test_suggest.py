"""A misspelling gets the nearest name, not the whole list: a command (`gett`), a nested verb
(`triggers lss`), a choice (`-o jsn`), an option of a subcommand (`ls orders --prefx`, refused
with `ls`'s usage, not the top level's) and a function of `call` (`state:get`). And the short
commands start without the server side: `--version` and `get` import no service, engine,
HTTP server or PostgreSQL driver (what made them slow to start)."""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
import msgspec
import pytest

from stateworker.app.service import StateService
from tests.integration.cli.test_terminal import in_terminal
from tests.integration.cli.test_verbs import cli, failed
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("args", "usage", "says"), [
    (("gett", "orders", "o-1"), "usage: stateworker [", 'unknown command "gett"; did you mean '
     '"get"?'),
    (("triggers", "lss"), "usage: stateworker triggers ", 'unknown command "lss"; did you mean '
     '"ls"?'),
    (("ls", "orders", "-o", "jsn"), "usage: stateworker ls ", 'invalid choice: "jsn"; did you '
     'mean "json"?'),
    (("ls", "orders", "--prefx", "o-"), "usage: stateworker ls ",
     "unrecognized arguments: --prefx o-; --prefx: did you mean --prefix?"),
    (("principal", "ad", "bob"), "usage: stateworker principal ", 'did you mean "add"?'),
])
def test_a_misspelling_names_the_nearest_with_its_commands_usage(
        redis_server: RedisServer, prefix: str, args: tuple[str, ...], usage: str,
        says: str) -> None:
    status, shown = in_terminal(redis_server, prefix, *args)
    assert status == 2, shown
    assert shown.startswith(usage), shown
    assert says in shown, shown
    assert "delete-barrier" not in shown and "choose from" not in shown, shown  # not the list


def test_a_command_nothing_is_near_points_to_help(redis_server: RedisServer,
                                                  prefix: str) -> None:
    status, shown = in_terminal(redis_server, prefix, "zzzzzz")
    assert status == 2 and 'unknown command "zzzzzz"; `stateworker --help` lists them' in shown


async def test_call_of_a_misspelt_function_names_the_nearest(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    error = failed(await cli(redis_server, prefix, "call", "state:get",
                             '{"scope":"a","key":"b"}'), "UNKNOWN_FUNCTION")
    assert error["details"] == {"fn": "state:get", "nearest": "state::get"}
    assert 'did you mean "state::get"?' in error["message"]
    assert "state::transaction" not in error["message"]  # not every function
    far = failed(await cli(redis_server, prefix, "call", "zz::qq", "{}"), "UNKNOWN_FUNCTION")
    assert "nearest" not in far["details"]  # nothing near: the service's own message


SERVER_SIDE = ("stateworker.app.service", "stateworker.app.http", "stateworker.engines.catalog",
               "stateworker.state.lifecycle", "uvicorn", "httptools", "starlette", "psycopg",
               "prometheus_client", "opentelemetry.sdk")
PROBE = f"""\
import sys
from stateworker.app.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print([name for name in {SERVER_SIDE!r} if name in sys.modules], file=sys.stderr)
"""


@pytest.mark.parametrize("args", [("--version",), ("get", "SCOPE", "k"), ("ls", "SCOPE")],
                         ids=" ".join)
async def test_short_commands_do_not_import_the_server_side(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str,
        args: tuple[str, ...]) -> None:
    await cli(redis_server, prefix, "put", scope, "k", "1")
    argv = ["--redis-url", redis_server.url, *(scope if a == "SCOPE" else a for a in args)]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"},
        check=False))
    imported = msgspec.json.decode(done.stderr.splitlines()[-1].replace("'", '"'))
    assert imported == [], (done.stdout, done.stderr)
    assert done.stdout.strip(), done.stderr  # it ran: the version, the value, the listing
