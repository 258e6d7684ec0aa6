"""Principals and roles in the PostgreSQL snapshot: copied with the registry (never a
password), restored by `stateworker restore` into a new Redis, where each principal's ACL
user comes back off and without a password, named in the summary, until `principal passwd`;
and restored by the repair at start as well."""

from __future__ import annotations

import uuid

import msgspec
import psycopg
import pytest
import redis

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.keys import KeySpace, principal_stream
from stateworker.settings import Settings
from stateworker.state import lifecycle
from stateworker.state.tenancy import principals
from tests.integration.busproto import until
from tests.integration.services import run_cli
from tests.integration.snapshot.test_restore import restore_command
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def stored_rows(url: str, prefix: str) -> tuple[dict[str, str], dict[str, str]]:
    with psycopg.connect(url) as conn:
        found = [dict(conn.execute(f"SELECT name, record FROM {table} WHERE prefix = %s",
                                   (prefix,)).fetchall())
                 for table in ("sw_principals", "sw_roles")]
    return found[0], found[1]


async def snapshotted(own_redis: RedisServer, prefix: str, postgres_url: str,
                      who: str) -> Settings:
    """A role and a principal stored while the service (with its snapshot) runs, and in
    PostgreSQL once the snapshot copied them."""
    settings = Settings(redis_url=own_redis.url, prefix=prefix, partitions=4,
                        postgres_url=postgres_url, lease_ms=1000)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateStore.open(own_redis.url, prefix=prefix, partitions=4) as store, \
            lifecycle.open_state(settings=settings, reaper=False) as state:
        await store.set("orders/1", "k", 1)
        await principals.add_role(state, "orders", ["read", "write"], ["orders/*"], False, [])
        await principals.add_principal(state, who, ["orders", "reader"], ["tenant-*"])
        await principals.set_user(state, who, "the-password")
        await until(lambda: len(stored_rows(postgres_url, prefix)[0]) == 1
                    and len(stored_rows(postgres_url, prefix)[1]) == 1, 30,
                    "the principal and role in PostgreSQL")
    return settings


async def test_restore_brings_principals_and_roles_back_and_names_the_users_to_enable(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    who = f"p{uuid.uuid4().hex[:8]}"
    await snapshotted(own_redis, prefix, postgres_url, who)
    rows = stored_rows(postgres_url, prefix)
    assert "the-password" not in str(rows)
    assert msgspec.json.decode(rows[0][who])["act_as"] == ["tenant-*"]
    client = own_redis.client()
    keys = KeySpace(prefix, 4)
    records = (client.hgetall(keys.principals), client.hgetall(keys.roles))

    client.flushall()  # a new Redis: no data, no ACL users
    client.acl_deluser(who)
    done = restore_command(own_redis.url, prefix, postgres_url)
    assert done.returncode == 0, done.stderr
    summary = msgspec.json.decode(done.stdout)
    assert (summary["principals"], summary["roles"]) == (1, 1)
    assert summary["principals_without_user"] == [who] and summary["acl_refused"] is None
    assert (client.hgetall(keys.principals), client.hgetall(keys.roles)) == records
    user = client.acl_getuser(who)
    assert "off" in user["flags"] and user["passwords"] == []
    assert [g["name"] for g in client.xinfo_groups(principal_stream(prefix, "state", who))] == [
        b"state"]
    passwd = run_cli(own_redis, prefix, "principal", "passwd", who)
    assert passwd.returncode == 0, passwd.stderr
    password = msgspec.json.decode(passwd.stdout)["password"]
    with redis.Redis(port=own_redis.port, username=who, password=password) as conn:
        assert conn.xadd(principal_stream(prefix, "state", who), {"a": "b"})

    # A principal whose user is still there keeps it as it is.
    client.flushdb()
    again = restore_command(own_redis.url, prefix, postgres_url)
    assert again.returncode == 0, again.stderr
    assert msgspec.json.decode(again.stdout)["principals_without_user"] == []
    with redis.Redis(port=own_redis.port, username=who, password=password) as conn:
        assert conn.ping()


async def test_the_repair_at_start_restores_principals_and_roles(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        caplog: pytest.LogCaptureFixture) -> None:
    who = f"p{uuid.uuid4().hex[:8]}"
    settings = await snapshotted(own_redis, prefix, postgres_url, who)
    client = own_redis.client()
    client.flushall()
    client.acl_deluser(who)
    with caplog.at_level("WARNING", logger="stateworker.snapshot"):
        async with StateService.running(settings, BusOptions(block_ms=50)) as service:
            assert who in service.state.access.principals()
            service.state.access.check(who, "state::set", ["orders/2"])
    assert any(who in r.getMessage() and "principal passwd" in r.getMessage()
               for r in caplog.records)
    assert "off" in client.acl_getuser(who)["flags"]
