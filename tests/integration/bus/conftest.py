"""What the `acl` mode tests share (test_acl*.py): a Redis of each module's own, since ACL
users are server-wide, and the state service on it in `acl` mode."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from stateworker.bus.protocol import BusOptions
from tests.integration.services import settings_for
from tests.servers import RedisServer


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of the module's own: its ACL users are server-wide."""
    server = RedisServer(Path(tmp_path_factory.mktemp("acl-redis")))
    server.start()
    yield server
    server.kill()


@pytest.fixture
async def acl_service(acl_redis: RedisServer, prefix: str) -> AsyncIterator[Any]:
    from stateworker.app.service import StateService

    settings = settings_for(acl_redis, prefix, auth="acl")
    async with StateService.running(settings, BusOptions(block_ms=50)) as running:
        yield running
