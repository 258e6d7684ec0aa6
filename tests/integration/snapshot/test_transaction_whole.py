"""A transaction reaches PostgreSQL whole or not at all, also when a batch's rows (read as
they are now) already hold it though its events are past the batch: a restore from the
snapshot at any moment holds every change of a transaction or none.

A transfer between two accounts of one scope (`state::transaction`: a from 100 to 50, b from 0
to 50) is committed while the snapshot lags: `a` changed in the snapshot's next batch, `b`
only after it. The tests drive the snapshotter's steps by hand (`Snapshotter._step`), so the
batch boundary falls exactly there."""

from __future__ import annotations

import msgspec
import pytest

from stateworker.keys import KeySpace
from stateworker.snapshot.rows import BATCH
from tests.integration.snapshot.driven import bus_call as call
from tests.integration.snapshot.driven import opened, snapshot_of
from tests.integration.snapshot.test_older_copy_between_rounds import stepped
from tests.integration.snapshot.test_repair import PARTITIONS, settings_for
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

SCOPE = "bank"


def transfer(amount: int) -> dict[str, object]:
    return {"scope": SCOPE, "ops": [
        {"op": "update", "key": "a", "ops": [{"type": "increment", "path": "n", "by": -amount}]},
        {"op": "update", "key": "b", "ops": [{"type": "increment", "path": "n", "by": amount}]}]}


async def test_a_batch_whose_rows_hold_a_later_transaction_commits_all_of_it(
        own_redis: RedisServer, prefix: str, postgres_url: str) -> None:
    settings = settings_for(own_redis.url, prefix, postgres_url)
    events = KeySpace(prefix, PARTITIONS).for_scope(SCOPE).events
    redis = own_redis.client()
    async with opened(settings) as state, stepped(state, postgres_url) as snap:
        await snap._step()  # (a round: the partition's position, at its stream's end)
        assert snap.positions
        await call(state, "state::set", {"scope": SCOPE, "key": "a", "value": {"n": 100}}, "c-a")
        await call(state, "state::set-many", {"scope": SCOPE, "entries": [
            {"key": f"f{i}", "value": i} for i in range(BATCH - 1)]}, "c-fill")
        await call(state, "state::set", {"scope": SCOPE, "key": "b", "value": {"n": 0}}, "c-b")
        await call(state, "state::transaction", transfer(50), "c-tx")
        assert redis.xlen(events) == BATCH + 3  # a, the fillers, b, then the transfer's two
        await snap._step()  # one batch: a and the fillers; b and the transfer after it
        held = snapshot_of(postgres_url, prefix)
        assert redis.xlen(events) == BATCH + 3
    pair = (held.get((SCOPE, "a")), held.get((SCOPE, "b")))
    # Before the fix: ('{"n":50}', 2) and None: the transfer's debit without its credit.
    assert pair in ((('{"n":100}', 1), None), (('{"n":50}', 2), ('{"n":50}', 2))), pair

    # What a restore from that moment brings back keeps the sum.
    redis.flushall()
    async with opened(settings) as state:  # (the repair at start restores the snapshot)
        got = {key: await call(state, "state::get", {"scope": SCOPE, "key": key}, f"g-{key}")
               for key in ("a", "b")}
    values = {key: msgspec.json.decode(bytes(raw)) for key, raw in got.items()}
    assert values in ({"a": {"n": 100}, "b": None}, {"a": {"n": 50}, "b": {"n": 50}}), values
