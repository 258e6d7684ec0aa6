"""What the tests that run the service or call it share: a service's settings, and the
`stateworker` command against a test's Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from stateworker.settings import Settings
from tests.servers import RedisServer


def settings_for(server: RedisServer | str, prefix: str, **extra: Any) -> Settings:
    """A service's settings: the test's Redis (the server or its URL), its prefix, 4 partitions."""
    url = server if isinstance(server, str) else server.url
    return Settings(redis_url=url, prefix=prefix, partitions=4, **extra)


def run_cli(server: RedisServer, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stateworker", "--redis-url", server.url, *args],
        env={**os.environ, "STATEWORKER_PREFIX": prefix, "STATEWORKER_PARTITIONS": "4"},
        capture_output=True, text=True, timeout=60, check=False)
