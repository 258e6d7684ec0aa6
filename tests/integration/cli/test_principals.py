"""`stateworker principal ...` and `role ...` against a real Redis: a principal's ACL user,
stream and record; its password printed once or read from stdin, and rotated; `remove`
waiting for the service to serve its stream; roles added, listed, refused and removed."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import anyio
import msgspec
import pytest

from stateworker.keys import KeySpace, principal_stream
from tests.integration.acl_users import logs_in
from tests.integration.services import run_cli
from tests.servers import RedisServer, free_port

pytestmark = pytest.mark.anyio


def name() -> str:
    """A principal name of its own: ACL users are the server's, not the prefix's."""
    return f"p{uuid.uuid4().hex[:10]}"


def cli(server: RedisServer, prefix: str, *args: str, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    if stdin is None:
        return run_cli(server, prefix, *args)
    return subprocess.run(
        [sys.executable, "-m", "stateworker", "--redis-url", server.url, *args], input=stdin,
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"},
        capture_output=True, text=True, timeout=60, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return msgspec.json.decode(done.stdout)


def refused(done: subprocess.CompletedProcess[str], code: str) -> dict[str, Any]:
    assert done.returncode == 1, (done.stdout, done.stderr)
    error: dict[str, Any] = msgspec.json.decode(done.stderr.strip().splitlines()[-1])
    assert error["code"] == code, error
    return error


def test_principal_add_creates_its_user_stream_and_record(redis_server: RedisServer,
                                                          prefix: str) -> None:
    who = name()
    shown = ok(cli(redis_server, prefix, "principal", "add", who, "--role", "reader",
                   "--role", "writer", "--act-as", "tenant-*", "--act-as", "moco-*"))
    assert shown["principal"] == who and shown["roles"] == ["reader", "writer"]
    assert shown["act_as"] == ["tenant-*", "moco-*"] and len(shown["password"]) >= 32
    assert logs_in(redis_server.port, who, shown["password"])
    assert not logs_in(redis_server.port, who, "wrong")
    client = redis_server.client()
    stream = principal_stream(prefix, "state", who)
    assert [g["name"] for g in client.xinfo_groups(stream)] == [b"state"]
    record = msgspec.json.decode(client.hget(KeySpace(prefix, 4).principals, who))
    assert record["roles"] == ["reader", "writer"] and "password" not in str(record)
    assert shown["password"] not in str(client.hgetall(KeySpace(prefix, 4).principals))
    listed = ok(cli(redis_server, prefix, "principal", "list"))["principals"]
    assert [(p["name"], p["roles"], p["act_as"], p["acl_user"]) for p in listed] == [
        (who, ["reader", "writer"], ["tenant-*", "moco-*"], True)]
    assert "password" not in listed[0]
    again = cli(redis_server, prefix, "principal", "add", who, "--role", "reader")
    assert refused(again, "CONFLICT")["details"] == {"name": who}
    assert logs_in(redis_server.port, who, shown["password"])  # the refused add changed nothing


def test_a_password_from_stdin_is_not_printed_and_passwd_rotates_it(
        redis_server: RedisServer, prefix: str) -> None:
    who = name()
    shown = ok(cli(redis_server, prefix, "principal", "add", who, "--role", "reader",
                   "--password-stdin", stdin="first-secret\n"))
    assert "password" not in shown and "first-secret" not in str(shown)
    assert logs_in(redis_server.port, who, "first-secret")
    rotated = ok(cli(redis_server, prefix, "principal", "passwd", who))
    assert not logs_in(redis_server.port, who, "first-secret")
    assert logs_in(redis_server.port, who, rotated["password"])
    ok(cli(redis_server, prefix, "principal", "passwd", who, "--password-stdin",
           stdin="third-secret\n"))
    assert logs_in(redis_server.port, who, "third-secret")
    user = redis_server.client().acl_getuser(who)
    assert len(user["selectors"]) == 1 and len(user["passwords"]) == 1  # rotated, not added
    assert not logs_in(redis_server.port, who, rotated["password"])
    refused(cli(redis_server, prefix, "principal", "passwd", name()), "NOT_FOUND")


async def test_principal_remove_waits_until_its_stream_is_served(redis_server: RedisServer,
                                                                 prefix: str) -> None:
    who = name()
    shown = ok(cli(redis_server, prefix, "principal", "add", who, "--role", "writer"))
    client = redis_server.client()
    stream = principal_stream(prefix, "state", who)
    client.xadd(stream, {"id": "c-1", "fn": "state::get", "body": "{}", "reply": ""})
    waited = await anyio.to_thread.run_sync(
        lambda: cli(redis_server, prefix, "principal", "remove", who, "--timeout", "0.5"))
    assert waited.returncode == 1 and "still has calls not served" in waited.stderr
    assert "waiting for the service" in waited.stderr and "Traceback" not in waited.stderr
    assert not logs_in(redis_server.port, who, shown["password"])  # the user went first
    assert client.hexists(KeySpace(prefix, 4).principals, who)  # the record waits
    # The service reads and acknowledges the call (here by hand, as the runtime does).
    ((_, entries),) = client.xreadgroup("state", "svc", {stream: ">"})
    client.xack(stream, "state", entries[0][0])
    removed = ok(cli(redis_server, prefix, "principal", "remove", who))
    assert removed == {"principal": who, "removed": True, "streams_deleted": [stream],
                       "triggers_unregistered": [], "scopes_kept_private": []}
    assert not client.exists(stream)
    assert not client.hexists(KeySpace(prefix, 4).principals, who)
    assert ok(cli(redis_server, prefix, "principal", "list")) == {"principals": []}


def test_principal_remove_deletes_no_user_that_is_not_a_principals(
        redis_server: RedisServer, prefix: str) -> None:
    """A slip of the operator's (`principal remove stateworker`, the service's own user):
    the Redis user of a name that is no principal stays, and the service goes on."""
    other = name()
    redis_server.client().execute_command("ACL", "SETUSER", other, "on", ">svc-secret",
                                          "~*", "+@all")
    error = refused(cli(redis_server, prefix, "principal", "remove", other), "NOT_FOUND")
    assert error["details"] == {"name": other, "acl_user": "exists"}
    assert "nothing was deleted" in error["message"]
    assert logs_in(redis_server.port, other, "svc-secret")
    # a name no user and no principal has: as before (what a finished remove leaves)
    assert ok(cli(redis_server, prefix, "principal", "remove", name()))["removed"] is False


def test_roles_are_added_listed_refused_and_removed(redis_server: RedisServer,
                                                    prefix: str) -> None:
    added = ok(cli(redis_server, prefix, "role", "add", "orders", "--allow", "read,state::set",
                   "--scopes", "orders/*", "audit", "--services", "billing-*"))
    assert added == {"role": "orders", "replaced": False, "allow": ["read", "state::set"],
                     "scopes": ["orders/*", "audit"], "read_only": False,
                     "services": ["billing-*"], "created_ms": added["created_ms"]}
    replaced = ok(cli(redis_server, prefix, "role", "add", "orders", "--allow", "state::*",
                      "--scopes", "orders/*", "--read-only"))
    assert replaced["replaced"] and replaced["read_only"]
    roles = {r["name"]: r for r in ok(cli(redis_server, prefix, "role", "list"))["roles"]}
    assert set(roles) == {"reader", "writer", "admin", "orders"}
    assert roles["admin"]["builtin"] and not roles["orders"]["builtin"]
    assert roles["orders"]["allow"] == ["state::*"]
    bad = cli(redis_server, prefix, "role", "add", "x", "--allow", "state::nope", "--scopes", "*")
    assert "state::nope" in refused(bad, "INVALID_REQUEST")["message"]
    engine = ok(cli(redis_server, prefix, "role", "add", "moco", "--allow",
                    "builtin.state.get_state", "--scopes", "*"))  # (an engine's function)
    assert engine["allow"] == ["builtin.state.get_state"]
    assert ok(cli(redis_server, prefix, "role", "remove", "moco"))["removed"] is True
    refused(cli(redis_server, prefix, "role", "add", "admin", "--allow", "read", "--scopes",
                "*"), "CONFLICT")
    refused(cli(redis_server, prefix, "role", "remove", "reader"), "CONFLICT")
    unknown = cli(redis_server, prefix, "principal", "add", name(), "--role", "nope")
    assert refused(unknown, "NOT_FOUND")["details"] == {"role": "nope"}
    who = name()
    ok(cli(redis_server, prefix, "principal", "add", who, "--role", "orders", "reader"))
    in_use = refused(cli(redis_server, prefix, "role", "remove", "orders"), "CONFLICT")
    assert in_use["details"] == {"role": "orders", "principal": who}
    ok(cli(redis_server, prefix, "principal", "remove", who))
    assert ok(cli(redis_server, prefix, "role", "remove", "orders")) == {
        "role": "orders", "removed": True}
    assert ok(cli(redis_server, prefix, "role", "remove", "orders"))["removed"] is False


def test_admin_help_names_the_families_and_the_built_in_roles(redis_server: RedisServer,
                                                              prefix: str) -> None:
    shown = run_cli(redis_server, prefix, "role", "--help")
    assert shown.returncode == 0
    for text in ("read", "write", "triggers", "claims", "admin", "reader", "writer",
                 "--read-only"):
        assert text in shown.stdout, text


@pytest.mark.parametrize("command", [["principal", "list"], ["role", "list"]])
def test_no_redis_is_unavailable_as_for_every_command(command: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", url, *command],
                          capture_output=True, text=True, timeout=60, check=False)
    error = refused(done, "UNAVAILABLE")
    assert "Connection refused" in error["message"] and error["details"] == {"redis": url}


def test_an_existing_redis_user_is_not_taken_over_without_replace(
        redis_server: RedisServer, prefix: str) -> None:
    """`principal add` of a name Redis already has a user of (the service's, an operator's)
    refuses unless --replace; the user this command connects as and `default`, always."""
    client = redis_server.client()
    other = name()
    client.execute_command("ACL", "SETUSER", other, "on", ">its-own-password", "+ping")
    try:
        taken = cli(redis_server, prefix, "principal", "add", other, "--role", "reader")
        assert refused(taken, "CONFLICT")["details"] == {"name": other, "acl_user": "exists"}
        assert logs_in(redis_server.port, other, "its-own-password")  # untouched
        assert not client.hexists(KeySpace(prefix, 4).principals, other)
        for protected in ("default",):
            kept = cli(redis_server, prefix, "principal", "add", protected, "--role", "reader")
            assert refused(kept, "CONFLICT")["details"]["acl_user"] == "protected"
        shown = ok(cli(redis_server, prefix, "principal", "add", other, "--role", "reader",
                       "--replace"))
        assert logs_in(redis_server.port, other, shown["password"])
        assert not logs_in(redis_server.port, other, "its-own-password")
    finally:
        client.execute_command("ACL", "DELUSER", other)
