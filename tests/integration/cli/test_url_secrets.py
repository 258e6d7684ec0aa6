"""A password in a Redis URL never shows: not in a caller's error, not in `status`, not in the
service's log lines (URLs are shown with `***` for the password)."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from stateworker.transport.connection import shown_url
from tests.servers import RedisServer, free_port

SECRET = "s3cr3t-pa55"


def stateworker(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stateworker", "--redis-url", url, *args],
                          env={**os.environ, "STATEWORKER_PREFIX": "secrets"},
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("url", "shown"), [
    (f"redis://:{SECRET}@127.0.0.1:6380/0", "redis://:***@127.0.0.1:6380/0"),
    (f"redis://app:{SECRET}@db.local/2", "redis://app:***@db.local/2"),
    (f"redis://:a@{SECRET}@h:1/0", "redis://:***@h:1/0"),  # an @ inside the password
    (f"postgresql://u:{SECRET}@pg/sw?sslmode=require", "postgresql://u:***@pg/sw?sslmode=require"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://user@h:1", "redis://user@h:1"),
    ("unix:///run/redis.sock", "unix:///run/redis.sock"),
])
def test_a_shown_url_hides_only_the_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_no_redis_at_the_url_is_told_without_its_password() -> None:
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"  # nothing listens there
    called = stateworker(url, "call", "--timeout", "1", "state::get", '{"scope":"s","key":"k"}')
    assert called.returncode == 1
    error = msgspec.json.decode(called.stderr)
    assert error["code"] == "UNAVAILABLE" and "redis://:***@127.0.0.1" in error["message"]
    status = stateworker(url, "status")
    assert msgspec.json.decode(status.stdout)["redis"].startswith("redis://:***@127.0.0.1")
    for done in (called, status):
        assert SECRET not in done.stdout + done.stderr


def test_a_refused_password_is_told_without_it(redis_server: RedisServer) -> None:
    url = redis_server.url.replace("redis://", f"redis://:{SECRET}@", 1)  # Redis wants none
    served = stateworker(url, "serve")
    assert served.returncode != 0
    assert "***" in served.stdout + served.stderr
    assert SECRET not in served.stdout + served.stderr
