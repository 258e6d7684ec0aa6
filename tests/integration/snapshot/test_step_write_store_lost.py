"""A step write (state/core/once.py) that a Redis which lost the prefix's data refused with
STORE_LOST ran nothing: that answer is not its reply. Kept in place of its claim, it answered
every retry within the dedupe window with STORE_LOST, after the restore too, and the write
never ran; left as a claim, the retry met UNAVAILABLE for a minute. The claim is let go
instead: the retry after the recovery runs the write."""

from __future__ import annotations

import pytest

from stateworker.errors import StoreLost
from stateworker.keys import KeySpace
from tests.integration.snapshot.driven import (
    as_json,
    bus_call,
    nothing_unsaved,
    opened,
)
from tests.integration.snapshot.test_older_copy_between_rounds import stepped, steps_until
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

DELETE_BY_TOPIC = ("state::delete-by-topic", {"scope": "dt", "topic_pattern": "t"})
DELETE_BARRIER = ("state::delete-barrier", {"id": "bar"})


@pytest.mark.parametrize("call", [DELETE_BY_TOPIC, DELETE_BARRIER], ids=["dbt", "delbar"])
async def test_a_step_write_refused_by_a_wiped_redis_runs_when_retried_after_the_restore(
        own_redis: RedisServer, prefix: str, postgres_url: str,
        call: tuple[str, dict[str, object]]) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    client, keys = own_redis.client(), KeySpace(prefix, PARTITIONS)
    fn, body = call
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()
        await bus_call(state, "state::set", {"scope": "dt", "key": "a", "value": 1, "topic": "t"},
                       "before-set")
        await bus_call(state, "state::barrier",
                       {"event": {"key": "a"}, "condition_config": {"id": "bar", "expect": 2}},
                       "before-arrival")
        await steps_until(snap, lambda: nothing_unsaved(client, keys), "the writes before",
                          rounds=True)
        client.flushall()  # (Redis lost the prefix's data: every write is refused)
        with pytest.raises(StoreLost):
            await bus_call(state, fn, body, "lost")
        assert not any(client.xlen(p.unsaved_kept) for p in keys.all_partitions())
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        # (within the window and the claim's minute: neither a reply nor a claim stayed)
        again = as_json(await bus_call(state, fn, body, "lost"))
        assert again == ({"deleted": 1} if fn == DELETE_BY_TOPIC[0] else {"deleted": True})
        assert as_json(await bus_call(state, fn, body, "lost")) == again  # (kept now)
