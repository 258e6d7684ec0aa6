"""On the 3+3 cluster a bus call's own script answers it where the layout allows (the fused
path, lua/includes/answer.lua): its reply list on the node of its state. The reply is the one
the service would write, the entry is acknowledged either way (by the script when the stream
is on that node too, else by the service), and where the reply list is elsewhere, or the
service's map is stale (the list's slot moved), the service answers, and each call is applied
once."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from redis.asyncio.cluster import RedisCluster as AsyncClusterClient

from stateworker import StateClient
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.bus.reply_writer import ReplyWriter
from stateworker.keys import KeySpace, bus_stream, call_field, reply_list_on
from stateworker.settings import Settings
from stateworker.transport.slots import key_slot
from tests.cluster import RedisCluster
from tests.integration.busproto import until

pytestmark = pytest.mark.anyio

PARTITIONS = 6


def _partition_ports(cluster: RedisCluster, prefix: str) -> list[int]:
    keys = KeySpace(prefix, PARTITIONS)
    return [cluster.owner(key_slot(keys.partition(n).tag)).port for n in range(PARTITIONS)]


@pytest.fixture
def laid_out(redis_cluster: RedisCluster, prefix: str) -> str:
    """A prefix whose partitions sit on every primary."""
    primaries = {node.port for node in redis_cluster.primaries()}
    for attempt in range(1000):
        ports = _partition_ports(redis_cluster, f"{prefix}{attempt}")
        if set(ports) == primaries:
            return f"{prefix}{attempt}"
    raise AssertionError("no prefix spreads its partitions over every primary")


def _list_on(cluster: RedisCluster, prefix: str, port: int) -> str:
    """A reply list of a new client whose slot the primary on `port` serves."""
    client = f"{prefix}:reply:{uuid.uuid4().hex}"
    return next(name for n in range(10_000) if cluster.owner(
        key_slot(name := reply_list_on(client, n))).port == port)


def _scope_in(partition: int) -> str:
    keys = KeySpace("any", PARTITIONS)
    return next(f"s{n}" for n in range(10_000) if keys.partition_of(f"s{n}") == partition)


@contextmanager
def documents_written(service: StateService) -> Iterator[list[bytes]]:
    """The reply documents the service itself queues while the block runs (not the scripts')."""
    replies: ReplyWriter = service.runtime.replies
    written: list[bytes] = []
    queue = replies.queue

    def counting(reply_key: bytes, document: bytes | None, *args: Any, **kwargs: Any) -> None:
        if document is not None:
            written.append(document)
        queue(reply_key, document, *args, **kwargs)

    replies.queue = counting  # type: ignore[method-assign]
    try:
        yield written
    finally:
        replies.queue = queue  # type: ignore[method-assign]


@pytest.fixture
async def raw(redis_cluster: RedisCluster) -> AsyncIterator[AsyncClusterClient]:
    client = AsyncClusterClient(host="127.0.0.1", port=redis_cluster.primaries()[0].port)
    yield client
    await client.aclose()


def _id_at_home(scope: str) -> str:
    """A call id whose home is `scope`'s partition (keys.id_home), as StateClient draws them:
    a state::get binds it in the script only there."""
    keys = KeySpace("any", PARTITIONS)
    while True:
        call_id = uuid.uuid4().hex
        if keys.id_home(call_field(call_id)) == keys.partition_of(scope):
            return call_id


async def _call(raw: AsyncClusterClient, prefix: str, reply: str, fn: str,
                body: dict[str, Any]) -> dict[str, Any]:
    call_id = _id_at_home(body["scope"])
    await raw.xadd(bus_stream(prefix, "state"), {
        "id": call_id, "fn": fn, "body": msgspec.json.encode(body), "reply": reply})
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None, f"no reply to {fn} within 10 s"
    document: dict[str, Any] = msgspec.json.decode(popped[1])
    assert document["id"] == call_id and document["ok"] is True, document
    return document


async def _round(raw: AsyncClusterClient, prefix: str, reply: str, scope: str) -> None:
    """set, get, update, delete of one key, each checked."""
    made = await _call(raw, prefix, reply, "state::set",
                       {"scope": scope, "key": "k", "value": {"n": 1}})
    assert made["result"]["created"] is True and made["result"]["version"] == 1
    got = await _call(raw, prefix, reply, "state::get", {"scope": scope, "key": "k"})
    assert got["result"] == {"n": 1}
    updated = await _call(raw, prefix, reply, "state::update", {
        "scope": scope, "key": "k", "ops": [{"type": "increment", "path": "n", "by": 2}]})
    assert updated["result"] == {"old_value": {"n": 1}, "new_value": {"n": 3}, "version": 2}
    deleted = await _call(raw, prefix, reply, "state::delete", {"scope": scope, "key": "k"})
    assert deleted["result"] == {"n": 3}


async def _drained(raw: AsyncClusterClient, prefix: str) -> bool:
    """Every call's entry acknowledged and deleted."""
    stream = bus_stream(prefix, "state")
    return bool(await raw.xlen(stream) == 0
                and (await raw.xpending(stream, "state"))["pending"] == 0)


async def test_a_call_whose_reply_list_is_on_its_states_node_is_answered_by_its_script(
        redis_cluster: RedisCluster, laid_out: str, raw: AsyncClusterClient) -> None:
    settings = Settings(redis_url=redis_cluster.urls, prefix=laid_out, partitions=PARTITIONS,
                        dispatch=False)
    ports = _partition_ports(redis_cluster, laid_out)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        for partition in range(PARTITIONS):
            scope = _scope_in(partition)
            here = _list_on(redis_cluster, laid_out, ports[partition])
            with documents_written(service) as written:
                await _round(raw, laid_out, here, scope)
            assert written == [], f"partition {partition}: the service wrote replies"
            # a reply list on another node than the state: the service answers
            other = next(port for port in ports if port != ports[partition])
            away = _list_on(redis_cluster, laid_out, other)
            with documents_written(service) as written:
                await _round(raw, laid_out, away, scope)
            assert len(written) == 4
        # (the stream is on one node: the calls on the others were acknowledged by the service)
        await until(lambda: _drained(raw, laid_out), 10, "every entry acknowledged")


async def test_a_reply_list_moved_away_since_the_services_map_is_answered_by_the_service(
        redis_cluster: RedisCluster, laid_out: str, raw: AsyncClusterClient) -> None:
    """The service's map says the list shares the state's node, but its slot moved: the
    script sees it before its first write and leaves the reply to the service; the call is
    applied once."""
    settings = Settings(redis_url=redis_cluster.urls, prefix=laid_out, partitions=PARTITIONS,
                        dispatch=False)
    ports = _partition_ports(redis_cluster, laid_out)
    scope = _scope_in(0)
    home = ports[0]
    reply = _list_on(redis_cluster, laid_out, home)
    slot = key_slot(reply)
    elsewhere = next(node.port for node in redis_cluster.primaries() if node.port != home)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service:
        with documents_written(service) as written:
            await _call(raw, laid_out, reply, "state::set",
                        {"scope": scope, "key": "k", "value": 1})
        assert written == []  # (fused while the list is on the state's node)
        redis_cluster.move_slot(slot, elsewhere)
        try:
            with documents_written(service) as written:
                made = await _call(raw, laid_out, reply, "state::set",
                                   {"scope": scope, "key": "k", "value": 2})
                got = await _call(raw, laid_out, reply, "state::get",
                                  {"scope": scope, "key": "k"})
            assert made["result"]["version"] == 2 and made["result"]["old_value"] == 1
            assert got["result"] == 2
            assert len(written) == 2
        finally:
            redis_cluster.move_slot(slot, home)
        await until(lambda: _drained(raw, laid_out), 10, "every entry acknowledged")


async def test_a_client_on_a_cluster_keeps_a_reply_list_on_each_node_and_is_answered_by_scripts(
        redis_cluster: RedisCluster, laid_out: str, raw: AsyncClusterClient) -> None:
    """StateClient picks, per call, the reply list (and with 3 shards the stream) on the
    node of the call's scope: every scoped call is answered by its script."""
    settings = Settings(redis_url=redis_cluster.urls, prefix=laid_out, partitions=PARTITIONS,
                        dispatch=False, bus_shards=3)
    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            StateClient(settings=settings, timeout=30) as client:
        assert client._routes is not None
        lists = client._routes.lists
        assert sorted(redis_cluster.owner(key_slot(name)).port for name in lists) == sorted(
            node.port for node in redis_cluster.primaries())
        with documents_written(service) as written:
            for partition in range(PARTITIONS):
                scope = _scope_in(partition)
                await client.call("state::set", {"scope": scope, "key": "k", "value": partition})
                assert await client.call("state::get", {"scope": scope, "key": "k"}) == partition
            assert written == []
            # a call naming no scope: answered by the service, on the first list
            assert await client.call("state::list-namespaces", {}) is not None
            assert len(written) == 1
