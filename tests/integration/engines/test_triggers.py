"""The engines' front-ends write the one store: a trigger registered on a scope fires for writes
made through moco's activities, Dagu's actions, an isolated (KeeperHub) call and the native
functions alike, in order, with the same event body."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.handlers import Handler
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

DAGU = {"dag_name": "etl", "execution_id": "dagu-run"}
MOCO = {"user_id": "alice", "execution_id": "moco-run"}
KEEPERHUB = {"org_id": "o1", "workflow_id": "w1", "execution_id": "kh-run"}


async def test_one_trigger_fires_for_moco_dagu_and_native_writes_alike(
        service: StateService, redis_server: RedisServer, prefix: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    shared = "dagu/global/_"  # Dagu's global namespace, which moco reaches as a shared one
    async with StateClient(settings=settings, caller="native") as client, \
            Handler(settings).running() as handler:
        for trigger_id, scope in (("on-shared", shared), ("on-alice", "alice:tasks"),
                                  ("on-workflow", "wf/o1/w1")):
            await client.call("state::register-trigger", {
                "id": trigger_id, "function_id": "reactor::on_change", "service": "reactor",
                "config": {"scope": scope}})
        steps: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
            ("state.set", {"scope": "global", "key": "cursor", "value": 1}, DAGU),
            ("builtin.state.set_state", {"namespace": shared, "in_global_ns": True,
                                         "key": "cursor", "value": 2}, MOCO),
            ("state.diff", {"scope": "global", "key": "cursor", "value": 3}, DAGU),
            ("state::update", {"scope": shared, "key": "cursor",
                               "ops": [{"type": "increment", "path": "", "by": 1}]}, None),
            ("builtin.state.del_state", {"namespace": shared, "in_global_ns": True,
                                         "key": "cursor"}, MOCO),
            ("state.delete", {"scope": "global", "key": "cursor"}, DAGU),  # gone: no event
            ("builtin.state.set_state", {"namespace": "tasks", "key": "t-1", "value": "x",
                                         "topic": "new"}, MOCO),
            ("builtin.state.update_topic", {"namespace": "tasks", "key": "t-1",
                                            "topic": "done"}, MOCO),
            ("state::set", {"isolation": "workflow", "key": "k", "value": 1,
                            "max_keys": 100}, KEEPERHUB),
        ]
        for fn, body, context in steps:
            await client.call(fn, body, context=context)
        await until(lambda: len(handler.calls) >= 8, 10, "eight handler calls")
        seen = [(call_id.split(":")[0], body["event_type"], body["scope"], body["key"],
                 body["old_value"], body["new_value"], body["version"], body["by"])
                for call_id, body in handler.calls]
    assert len(seen) == 8  # the delete of a missing key changed nothing: no event
    assert seen[:5] == [
        ("on-shared", "state:created", shared, "cursor", None, 1, 1, "dagu-run"),
        ("on-shared", "state:updated", shared, "cursor", 1, 2, 2, "moco-run"),
        ("on-shared", "state:updated", shared, "cursor", 2, 3, 3, "dagu-run"),
        ("on-shared", "state:updated", shared, "cursor", 3, 4, 4, "native"),
        ("on-shared", "state:deleted", shared, "cursor", 4, None, 4, "moco-run"),
    ]
    assert sorted(seen[5:]) == [
        ("on-alice", "state:created", "alice:tasks", "t-1", None, "x", 1, "moco-run"),
        ("on-alice", "state:updated", "alice:tasks", "t-1", "x", "x", 1, "moco-run"),
        ("on-workflow", "state:created", "wf/o1/w1", "k", None, 1, 1, "kh-run"),
    ]
