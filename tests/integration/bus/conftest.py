"""What the `acl` mode tests share (test_acl*.py): the state service in `acl` mode on a Redis
of each module's own (`acl_redis`, tests/conftest.py: ACL users are server-wide)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from stateworker.bus.protocol import BusOptions
from tests.integration.services import settings_for
from tests.servers import RedisServer


@pytest.fixture
async def acl_service(acl_redis: RedisServer, prefix: str) -> AsyncIterator[Any]:
    from stateworker.app.service import StateService

    settings = settings_for(acl_redis, prefix, auth="acl")
    async with StateService.running(settings, BusOptions(block_ms=50)) as running:
        yield running
