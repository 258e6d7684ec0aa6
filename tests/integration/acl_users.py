"""Redis ACL users for tests of the service's own user (docs/security.md): one with exactly a
rule, and what Redis refused since; whether a user logs in with a password."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.servers import RedisServer

PASSWORD = "service-pass"


def add_user(server: RedisServer, name: str, rule: list[str]) -> str:
    """A Redis ACL user with exactly `rule` (and PASSWORD); its URL."""
    with server.client() as admin:
        admin.execute_command("ACL", "DELUSER", name)
        admin.execute_command("ACL", "SETUSER", name, *rule, f">{PASSWORD}")
    return f"redis://{name}:{PASSWORD}@127.0.0.1:{server.port}/0"


def refusals(server: RedisServer) -> list[dict[str, Any]]:
    """What Redis refused since the last reset (ACL LOG), as name -> value dicts."""
    with server.client() as admin:
        return [{k: v for k, v in e.items() if k in ("username", "reason", "object")}
                for e in admin.acl_log()]


def logs_in(port: int, user: str, password: str) -> bool:
    """Whether `user` logs in with `password` on the Redis at `port`. Asked once: a refused
    password is refused again, and redis-py's default retries (its AuthenticationError is a
    ConnectionError) would only ask ten times more, for about 3.5 s."""
    try:
        with redis.Redis(port=port, username=user, password=password,
                         retry=Retry(NoBackoff(), 0)) as client:
            return bool(client.ping())
    except redis.AuthenticationError:
        return False
