from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from stateworker import StateStore
from tests.servers import RedisServer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test, instead of flushing the shared server."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateStore]:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4) as opened:
        yield opened


@pytest.fixture
def scope() -> str:
    return f"scope-{uuid.uuid4().hex[:8]}"
