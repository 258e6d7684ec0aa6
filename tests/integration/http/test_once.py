"""A call id binds one call and a retry is never applied again, for the writes that run no
entry script (state/core/once.py: delete-by-topic, the barriers, the indexes, the triggers):
over HTTP (`Idempotency-Key`), over the bus with the same id, and sent at once to two
replicas. Before their reply was kept, a retry ran the write again."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from tests.integration.busproto import roundtrip
from tests.integration.http.conftest import http_settings, post, serving
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


async def test_a_retried_delete_by_topic_leaves_what_was_written_since(
        served: tuple[StateService, httpx.AsyncClient], redis_server: RedisServer,
        prefix: str, scope: str) -> None:
    """The first run deletes `a`; `b` is written with the topic after it; the retries (HTTP,
    then the bus with the same id) get the first reply and `b` stays (it was deleted, and the
    retries answered `deleted: 1` for it)."""
    _, http = served
    await post(http, "state::set", {"scope": scope, "key": "a", "value": 1, "topic": "t"})
    body = {"scope": scope, "topic_pattern": "t"}
    first = await post(http, "state::delete-by-topic", body, **{"Idempotency-Key": "dbt-1"})
    assert first == (200, {"id": "dbt-1", "ok": True, "result": {"deleted": 1}})
    await post(http, "state::set", {"scope": scope, "key": "b", "value": 2, "topic": "t"})
    assert await post(http, "state::delete-by-topic", body,
                      **{"Idempotency-Key": "dbt-1"}) == first
    raw = aredis.Redis(port=redis_server.port)
    try:
        again = await roundtrip(raw, prefix, "state::delete-by-topic", body, call_id="dbt-1")
    finally:
        await raw.aclose()
    assert again == first[1]
    _, entry = await post(http, "state::get-entry", {"scope": scope, "key": "b"})
    assert (entry["result"]["value"], entry["result"]["version"]) == (2, 1)


async def test_retries_of_step_writes_get_the_first_reply(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    """create-index answered `created: false` to its retry, delete-barrier deleted the barrier
    begun since (its arrival lost), and a barrier refused with BARRIER_CONFIG made a new
    barrier when retried after the first was deleted."""
    _, http = served

    async def twice(fn: str, body: dict[str, Any], key: str, between: Any = None
                    ) -> tuple[int, dict[str, Any]]:
        first = await post(http, fn, body, **{"Idempotency-Key": key})
        if between is not None:
            await between()
        assert await post(http, fn, body, **{"Idempotency-Key": key}) == first
        return first

    index = {"scope": "idx", "pointer": "/n"}
    assert (await twice("state::create-index", index, "ci"))[1]["result"]["created"] is True
    assert (await twice("state::drop-index", index, "di"))[1]["result"]["dropped"] is True

    def arrival(key: str, expect: int = 2) -> dict[str, Any]:
        return {"event": {"key": key}, "condition_config": {"id": "bar", "expect": expect}}

    async def arrive_a() -> None:
        await post(http, "state::barrier", arrival("a"))

    await arrive_a()
    deleted = await twice("state::delete-barrier", {"id": "bar"}, "del-bar", arrive_a)
    assert deleted[1]["result"] == {"deleted": True}
    _, last = await post(http, "state::barrier", arrival("b"))
    assert last["result"]["decision"] == "allow", last  # `a`'s arrival was kept

    await post(http, "state::barrier", {**arrival("a", 5),
                                        "condition_config": {"id": "cfg", "expect": 2}})

    async def delete_cfg() -> None:
        await post(http, "state::delete-barrier", {"id": "cfg"})

    body = {"event": {"key": "x"}, "condition_config": {"id": "cfg", "expect": 3}}
    status, refused = await twice("state::barrier", body, "cfg-3", delete_cfg)
    assert (status, refused["error"]["code"]) == (409, "BARRIER_CONFIG")


async def test_one_id_sent_at_once_to_two_replicas_runs_once(
        redis_server: RedisServer, prefix: str) -> None:
    """Two services on one Redis, the same Idempotency-Key to both at once, 20 rounds: every
    answer is the first run's (a request that meets the run in progress is UNAVAILABLE, and
    its retry gets the reply), for a step write and an entry script alike."""
    settings = http_settings(redis_server.url, prefix)
    async with serving(settings) as (_, one), serving(settings) as (_, two):
        for round_ in range(20):
            index = {"scope": f"conc-{round_}", "pointer": "/n"}
            update = {"scope": f"conc-{round_}", "key": "n",
                      "ops": [{"type": "increment", "path": "n", "by": 1}]}
            for fn, body in (("state::create-index", index), ("state::update", update)):
                key = f"{fn}-{round_}"
                answers: list[tuple[int, dict[str, Any]]] = []

                async def send(http: httpx.AsyncClient, fn: str = fn, body: Any = body,
                               key: str = key, answers: list[Any] = answers) -> None:
                    answers.append(await post(http, fn, body, **{"Idempotency-Key": key}))

                async with anyio.create_task_group() as tg:
                    for http in (one, two, one, two):
                        tg.start_soon(send, http)
                final = await post(one, fn, body, **{"Idempotency-Key": key})
                assert final[0] == 200, final
                for status, answer in answers:
                    assert (status, answer) == final or (
                        status == 503 and answer["error"]["code"] == "UNAVAILABLE"), answer
            _, entry = await post(one, "state::get", {"scope": f"conc-{round_}", "key": "n"})
            assert entry["result"] == {"n": 1}
            _, listed = await post(one, "state::list-indexes", {"scope": f"conc-{round_}"})
            assert len(listed["result"]["indexes"]) == 1, listed


async def test_a_retry_refused_for_memory_is_not_told_nothing_was_written(
        own_redis: RedisServer, prefix: str, scope: str) -> None:
    """The first request is applied (its reply lost, say); Redis fills up; the retry with the
    same Idempotency-Key is refused before its script could find the call's record. It must
    not say that nothing was written: the call was. Once Redis has room the retry gets the
    recorded reply, applied once. (A Redis of its own: maxmemory is server-wide.)"""
    body = {"scope": scope, "key": "paid", "ops": [{"type": "increment", "path": "n", "by": 1}]}
    key = {"Idempotency-Key": "pay-1"}
    raw = aredis.Redis(port=own_redis.port)
    try:
        async with serving(http_settings(own_redis.url, prefix)) as (_, http):
            first = await post(http, "state::update", body, **key)
            assert first[0] == 200, first
            await raw.config_set("maxmemory-policy", "noeviction")
            await raw.config_set("maxmemory", 1)  # full
            status, refused = await post(http, "state::update", body, **key)
            error = refused["error"]
            assert (status, error["code"], error["details"]["path"]) == (
                507, "RESOURCE_EXHAUSTED", "Idempotency-Key"), refused
            assert "nothing was written" not in error["message"], error
            assert "may have been applied" in error["message"], error
            await raw.config_set("maxmemory", 0)  # room again
            assert await post(http, "state::update", body, **key) == first
            _, now = await post(http, "state::get", {"scope": scope, "key": "paid"})
            assert now["result"] == {"n": 1}, now
    finally:
        await raw.aclose()
