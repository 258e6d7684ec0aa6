"""Redis ACL users for tests of the service's own user (docs/security.md): one with exactly a
rule, and what Redis refused since."""

from __future__ import annotations

from typing import Any

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
