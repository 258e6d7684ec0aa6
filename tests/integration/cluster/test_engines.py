"""The engines' front-ends (moco's activities, Dagu's actions, KeeperHub's options of the native
functions) over the bus, on one server and on the 3+3 cluster: their main paths, the state and
the events they write, the same on both. The namespaces used land in several partitions, so on
the cluster on several primaries (moco's `list_namespaces` reads every partition)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from stateworker import KeyLimit, StateClient, StateStore
from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings

pytestmark = pytest.mark.anyio

ALICE = {"user_id": "alice", "execution_id": "run-a"}
BOB = {"user_id": "bob", "execution_id": "run-b"}
ETL = {"dag_name": "etl", "execution_id": "dagu-run"}
RUN = {"org_id": "org_1", "workflow_id": "wf_7", "execution_id": "exec_42"}


@pytest.fixture
async def bus(url: str, prefix: str) -> AsyncIterator[StateClient]:
    """A state service on `url` and a client of it."""
    settings = Settings(redis_url=url, prefix=prefix, partitions=4)
    async with StateService.running(settings, BusOptions(block_ms=50)), \
            StateClient(settings=settings, timeout=30) as client:
        yield client


async def history(store: StateStore, scope: str) -> list[tuple[str, str, Any, int, str | None]]:
    """(type, key, new value, version, by) of the scope's events."""
    return [(e.type, e.key, bytes(e.new_value).decode(), e.version, e.by)
            for e in await store.events(scope)]


async def test_moco_activities(bus: StateClient, store_on: StateStore) -> None:
    async def moco(activity: str, body: dict[str, Any], context: dict[str, Any] = ALICE) -> Any:
        return await bus.call(f"builtin.state.{activity}", body, context=context)

    task = {"namespace": "tasks", "key": "t-1"}
    await moco("set_state", {**task, "value": {"n": 1}, "topic": "pending"})
    await moco("set_state", {**task, "value": "bob's"}, BOB)
    for namespace in ("cache", "a:b", "queue"):
        await moco("set_state", {"namespace": namespace, "key": "k", "value": namespace})
    await moco("set_state", {**task, "value": "shared", "in_global_ns": True})
    await moco("update_topic", {**task, "topic": "done"})
    assert await moco("get_state", task) == {"n": 1}
    assert await moco("get_state", task, BOB) == "bob's"
    assert await moco("get_state", {**task, "in_global_ns": True}, BOB) == "shared"
    listed = await moco("list_states", {"namespace": "tasks"})
    assert [(row["key"], row["topic"]) for row in listed] == [("t-1", "done")]
    assert await moco("list_namespaces", {}) == ["a:b", "cache", "queue", "tasks"]
    assert await moco("list_namespaces", {}, BOB) == ["tasks"]
    await moco("del_state", task)
    assert await moco("get_state", task) is None
    assert await history(store_on, "alice:tasks") == [
        ("state:created", "t-1", '{"n":1}', 1, "run-a"),
        ("state:updated", "t-1", '{"n":1}', 1, "run-a"),  # (the topic: value kept)
        ("state:deleted", "t-1", "null", 1, "run-a")]


async def test_dagu_actions(bus: StateClient, store_on: StateStore) -> None:
    async def dagu(action: str, body: dict[str, Any], context: dict[str, Any] = ETL) -> Any:
        return await bus.call(f"state.{action}", body, context=context)

    written = await dagu("set", {"key": "cursor", "value": {"last_id": 123}})
    assert (written["version"], written["created"]) == (1, True)
    same = await dagu("diff", {"key": "cursor", "value": {"last_id": 123}})
    assert (same["changed"], same["version"]) == (False, 1)
    changed = await dagu("diff", {"key": "cursor", "value": {"last_id": 124}})
    assert (changed["changed"], changed["previousVersion"], changed["version"]) == (True, 1, 2)
    await dagu("set", {"scope": "global", "key": "jobs/a", "value": 1})
    await dagu("set", {"key": "jobs/a", "value": 2}, {"dag_name": "other"})
    got = await dagu("get", {"key": "cursor"})
    assert (got["found"], got["value"], got["version"]) == (True, {"last_id": 124}, 2)
    listed = await dagu("list", {})
    assert [(e["key"], e["version"]) for e in listed["entries"]] == [("cursor", 2)]
    global_ = await dagu("list", {"scope": "global"})
    assert [e["key"] for e in global_["entries"]] == ["jobs/a"]
    assert (await dagu("delete", {"key": "cursor"}))["deleted"] is True
    assert await history(store_on, "dagu/dag/etl") == [
        ("state:created", "cursor", '{"last_id":123}', 1, "dagu-run"),
        ("state:updated", "cursor", '{"last_id":124}', 2, "dagu-run"),  # (the same: no event)
        ("state:deleted", "cursor", "null", 2, "dagu-run")]


async def test_keeperhub_options(bus: StateClient, store_on: StateStore) -> None:
    isolated = {"isolation": "workflow", "max_keys": 2}
    other = {**RUN, "workflow_id": "wf_8"}
    for key, context in (("a", RUN), ("b", RUN), ("a", other)):
        await bus.call("state::set", {**isolated, "key": key, "value": key}, context=context)
    with pytest.raises(KeyLimit) as refused:
        await bus.call("state::set", {**isolated, "key": "c", "value": 1}, context=RUN)
    assert refused.value.details["live_keys"] == 2
    await bus.call("state::set", {**isolated, "key": "a", "value": "again"}, context=RUN)
    listed = await bus.call("state::list-entries", {"isolation": "workflow"}, context=RUN)
    assert [(e["key"], e["version"], e["updated_by"]) for e in listed["entries"]] == [
        ("a", 2, "exec_42"), ("b", 1, "exec_42")]
    for context, value in ((RUN, "again"), (other, "a")):
        assert await bus.call("state::get", {"isolation": "workflow", "key": "a"},
                              context=context) == value
    assert [(t, k, v) for t, k, _, v, _ in await history(store_on, "wf/org_1/wf_7")] == [
        ("state:created", "a", 1), ("state:created", "b", 1), ("state:updated", "a", 2)]
