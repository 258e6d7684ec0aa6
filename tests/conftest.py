from __future__ import annotations

import compileall
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, settings

from stateworker import StateClient, StateStore, logs
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from tests.cluster import RedisCluster
from tests.servers import PostgresServer, RedisServer

# Property tests judge results, not speed: on a 2-core machine shared with the servers of the
# other tests an example can take longer than hypothesis's 200 ms deadline without any defect.
settings.register_profile("shared-machine", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")

# Every process a test starts imports this checkout's stateworker: a script run by its path
# (an example, a worker written to tmp_path, the `stateworker` command) has its own directory
# first on sys.path, and would otherwise get whichever checkout the venv's editable install
# points at.
ROOT = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


def pytest_configure(config: pytest.Config) -> None:
    """stateworker's bytecode written once, before the tests (by the controller, not each
    xdist worker): with PYTHONDONTWRITEBYTECODE set, as on this project's machines, every
    process a test starts (a service, the command, an example) compiled each module it
    imports from source again, ~0.3 s a start."""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(ROOT / "stateworker", quiet=1)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def repeats_said_afresh() -> None:
    """Each test begins with no recurring failure said (logs.repeats is the process's): a
    test that waits for the line of a failure sees its first, not silence because the test
    before said it a moment ago."""
    logs.repeats.clear()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A real Redis Cluster, 3 primaries with a replica each (tests/cluster.py), shared by the
    session: tests use a fresh prefix; one that kills or moves something leaves it healthy."""
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that change what the whole server shares
    (FUNCTION FLUSH, CONFIG SET maxmemory, a restart): the session-wide one stays as it was."""
    server = RedisServer(tmp_path / "own-redis")
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server of the module's own for `acl` mode tests: ACL users are server-wide."""
    server = RedisServer(Path(tmp_path_factory.mktemp("acl-redis")))
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


@pytest.fixture
async def service(redis_server: RedisServer, prefix: str) -> AsyncIterator[StateService]:
    """The state service in this process, on the shared Redis, with a fresh prefix."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    async with StateService.running(settings, BusOptions(block_ms=50)) as running:
        yield running


@pytest.fixture
async def client(service: StateService, redis_server: RedisServer,
                 prefix: str) -> AsyncIterator[StateClient]:
    """A StateClient of the `service`: calls over the bus, as another program makes them."""
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    async with StateClient(settings=settings, timeout=30) as opened:
        yield opened


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aredis.Redis]:
    """A plain redis-py client, to speak the bus protocol by hand."""
    client = aredis.Redis(port=redis_server.port)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.init()
    server.start()
    yield server
    server.stop()
    server.remove()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database per test on the session's PostgreSQL (dropped after the test)."""
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield postgres_server.url_for(name)
    with psycopg.connect(postgres_server.url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
