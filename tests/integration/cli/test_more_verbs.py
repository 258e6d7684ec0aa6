"""The verbs of issue 42 against a running service: `put --ttl --topic --if-version`, `del
--prefix` (every batch), `scopes`, `history`, `triggers ls|add|rm`; an empty listing that says
so on a terminal and keeps its JSON shape when piped; and tables that show numbers with their
stored digits (12.50, 9007199254740993), never through a float."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from tests.integration.cli.test_terminal import in_terminal
from tests.integration.cli.test_verbs import cli, failed
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

EXACT = '{"total":12.50,"big":9007199254740993}'


async def terminal(server: RedisServer, prefix: str, *args: str) -> tuple[int, str]:
    return await anyio.to_thread.run_sync(lambda: in_terminal(server, prefix, *args))


async def test_put_with_ttl_topic_and_if_version(service: StateService, client: StateClient,
                                                 redis_server: RedisServer, prefix: str,
                                                 scope: str) -> None:
    done = await cli(redis_server, prefix, "put", scope, "k", "1", "--ttl", "1h", "--topic",
                     "web", "--if-version", "0")
    assert done.returncode == 0, done.stderr
    entry = await client.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["topic"] == "web" and entry["expires_at"] is not None, entry
    stale = failed(await cli(redis_server, prefix, "put", scope, "k", "2", "--if-version", "7"),
                   "CONFLICT")
    assert stale["details"]["current_version"] == 1
    assert await client.get(scope, "k") == 1  # nothing written
    done = await cli(redis_server, prefix, "put", scope, "k", "3", "--if-version", "1")
    assert done.returncode == 0 and msgspec.json.decode(done.stdout)["version"] == 2
    bad = await cli(redis_server, prefix, "put", scope, "k", "4", "--ttl", "soon")
    assert bad.returncode == 2 and "must be a duration such as 30s" in bad.stderr


async def test_del_prefix_deletes_every_batch(service: StateService, client: StateClient,
                                              redis_server: RedisServer, prefix: str,
                                              scope: str) -> None:
    # more than one batch of state::delete-by-prefix (1000 a call)
    for start in range(0, 1001, 500):
        entries = [{"key": f"p-{n:04}", "value": n} for n in range(start, min(start + 500, 1001))]
        await client.call("state::set-many", {"scope": scope, "entries": entries})
    await client.set(scope, "q-1", 1)
    done = await cli(redis_server, prefix, "del", scope, "--prefix", "p-", "--timeout", "60")
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout) == {"deleted": 1001}
    assert await client.call("state::list_keys", {"scope": scope}) == {"keys": ["q-1"]}
    both = await cli(redis_server, prefix, "del", scope, "q-1", "--prefix", "q-")
    assert both.returncode == 2 and "give KEY or --prefix" in both.stderr


async def test_scopes_lists_the_scopes_and_says_when_none_match(
        service: StateService, client: StateClient, redis_server: RedisServer, prefix: str,
        scope: str) -> None:
    await client.set(scope, "a", 1)
    await client.set(f"{scope}-b", "a", 1)
    done = await cli(redis_server, prefix, "scopes", "--pattern", f"{scope}*")
    assert done.returncode == 0, done.stderr
    assert msgspec.json.decode(done.stdout) == {"namespaces": [scope, f"{scope}-b"]}
    status, shown = await terminal(redis_server, prefix, "scopes")
    assert status == 0 and shown.split() == ["SCOPE", scope, f"{scope}-b"], shown
    status, shown = await terminal(redis_server, prefix, "scopes", "--pattern", "nosuch*")
    assert status == 0 and shown.strip() == 'no scopes match "nosuch*"', shown
    piped = await cli(redis_server, prefix, "scopes", "--pattern", "nosuch*")
    assert msgspec.json.decode(piped.stdout) == {"namespaces": []}


async def test_history_shows_a_keys_changes_newest_first(
        service: StateService, client: StateClient, redis_server: RedisServer, prefix: str,
        scope: str) -> None:
    await client.call_json("state::set", f'{{"scope":"{scope}","key":"k","value":1}}'.encode())
    await client.call_json("state::set",
                           f'{{"scope":"{scope}","key":"k","value":{EXACT}}}'.encode())
    await client.set(scope, "other", 1)
    await client.delete(scope, "k")
    done = await cli(redis_server, prefix, "history", scope, "k")
    assert done.returncode == 0, done.stderr
    document = msgspec.json.decode(done.stdout)
    assert (document["scope"], document["key"], document["scanned"]) == (scope, "k", 1000)
    assert [e["event_type"] for e in document["events"]] == [
        "state:deleted", "state:updated", "state:created"]
    status, shown = await terminal(redis_server, prefix, "history", scope, "k")
    lines = shown.splitlines()
    assert status == 0 and lines[0].split() == ["REVISION", "TIME", "EVENT", "VERSION", "VALUE"]
    assert [line.split()[2:4] for line in lines[1:]] == [["deleted", "2"], ["updated", "2"],
                                                         ["created", "1"]]
    assert lines[1].endswith(EXACT) and lines[2].endswith(EXACT), shown  # the old value, deleted
    status, shown = await terminal(redis_server, prefix, "history", scope, "never")
    assert status == 0
    assert shown.strip() == (f'no changes of key "never" in scope "{scope}" among the last '
                             "1000 events of its partition")


async def test_triggers_ls_add_rm(service: StateService, client: StateClient,
                                  redis_server: RedisServer, prefix: str, scope: str) -> None:
    added = await cli(redis_server, prefix, "triggers", "add", "audit::seen", "--service",
                      "audit", "--scope", scope, "--key-prefix", "o-", "--event-type",
                      "created", "--event-type", "deleted", "--ttl", "1h", "--id", "t-1")
    assert added.returncode == 0, added.stderr
    assert msgspec.json.decode(added.stdout) == {"id": "t-1"}
    (listed,) = (await client.call("state::list-triggers", {}))["triggers"]
    assert (listed["function_id"], listed["service"], listed["ttl_ms"]) == (
        "audit::seen", "audit", 3_600_000)
    assert listed["config"] == {"scope": scope, "key_prefix": "o-",
                                "event_types": ["state:created", "state:deleted"]}
    await client.call_json("state::register-trigger", b'{"id":"t-2","function_id":"audit::big",'
                           b'"service":"audit","config":{"match":[{"pointer":"/t","equals":'
                           b'12.50}]}}')
    status, shown = await terminal(redis_server, prefix, "triggers", "ls")
    assert status == 0 and "t-1" in shown and f'scope="{scope}"' in shown, shown
    assert '"equals":12.50' in shown, shown  # the stored digits
    for trigger in ("t-1", "t-2"):
        removed = await cli(redis_server, prefix, "triggers", "rm", trigger)
        assert msgspec.json.decode(removed.stdout) == {"id": trigger, "removed": True}
    status, shown = await terminal(redis_server, prefix, "triggers", "ls")
    assert status == 0 and shown.strip() == "no triggers", shown
    piped = await cli(redis_server, prefix, "list-triggers")
    assert msgspec.json.decode(piped.stdout) == {"triggers": []}


async def test_an_empty_listing_says_so_on_a_terminal_and_keeps_its_json_when_piped(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    status, shown = await terminal(redis_server, prefix, "ls", "nosuch")
    assert status == 0 and shown.strip() == 'no keys in scope "nosuch"', shown
    status, shown = await terminal(redis_server, prefix, "ls", "nosuch", "--prefix", "o-")
    assert shown.strip() == 'no keys starting with "o-" in scope "nosuch"', shown
    status, shown = await terminal(redis_server, prefix, "query", "nosuch", "--where",
                                   "/total exists")
    assert status == 0 and shown.strip() == 'no entries of scope "nosuch" match', shown
    piped = await cli(redis_server, prefix, "ls", "nosuch")
    assert piped.returncode == 0 and msgspec.json.decode(piped.stdout) == {"entries": []}


async def test_tables_show_the_stored_digits(service: StateService, client: StateClient,
                                             redis_server: RedisServer, prefix: str,
                                             scope: str) -> None:
    done = await cli(redis_server, prefix, "put", scope, "o-1", EXACT)
    assert done.returncode == 0, done.stderr
    status, shown = await terminal(redis_server, prefix, "get", scope, "o-1")
    assert status == 0 and shown.strip() == EXACT
    for args in (("ls", scope, "--values"), ("query", scope, "--where", "/total gte 12.5")):
        status, shown = await terminal(redis_server, prefix, *args)
        rows = shown.splitlines()
        assert status == 0 and rows[0].startswith("KEY  VERSION  UPDATED"), shown
        assert rows[1].startswith("o-1") and rows[1].endswith(EXACT), (args, shown)
