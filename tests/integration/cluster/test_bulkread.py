"""state::get-many and state::delete-by-prefix in process on one server and on the 3+3 Redis
Cluster, against a Python model: get-many's entries equal get-entry's for every key (random
keys, values, updates and deletes), and delete-by-prefix in small batches deletes exactly the
model's keys with the prefix, one event each, leaving the others."""

from __future__ import annotations

import uuid

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore, codec
from stateworker.context import CallContext
from stateworker.state import functions
from tests.lua.ttl import HOUR_MS, expiring, pass_time

pytestmark = pytest.mark.anyio

KEYS = st.text(alphabet="ab/é\u00ea\U0001f600", min_size=1, max_size=3)
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
# ("set", key, n) | ("update", key, by) | ("delete", key, 0)
STEPS = st.lists(st.tuples(st.sampled_from(["set", "set", "update", "delete"]), KEYS,
                           st.integers(-5, 5)), max_size=25)


def fresh() -> str:
    return f"bulk-{uuid.uuid4().hex[:8]}"


async def apply(store: StateStore, scope: str, steps: list[tuple[str, str, int]]
                ) -> dict[str, tuple[int, int]]:
    """Run `steps` on the store and on the model: key -> (n, version)."""
    model: dict[str, tuple[int, int]] = {}
    for op, key, n in steps:
        if op == "set":
            await store.set(scope, key, {"n": n})
            model[key] = (n, model[key][1] + 1 if key in model else 1)
        elif op == "update":  # leaves the hash unknown until read
            await store.call("state::update", {"scope": scope, "key": key, "ops": [
                {"type": "increment", "path": "n", "by": n}]})
            old, version = model.get(key, (0, 0))
            model[key] = (old + n, version + 1)
        else:
            await store.delete(scope, key)
            model.pop(key, None)
    return model


@SETTINGS
@given(steps=STEPS, asked=st.lists(KEYS, max_size=12))
async def test_get_many_equals_get_entry_and_the_model(
        store_on: StateStore, steps: list[tuple[str, str, int]], asked: list[str]) -> None:
    scope = fresh()
    model = await apply(store_on, scope, steps)
    keys = asked + [key for _, key, _ in steps]  # (every key touched, and some twice)
    entries = (await store_on.call("state::get-many", {"scope": scope, "keys": keys}))["entries"]
    assert len(entries) == len(keys)
    for key, entry in zip(keys, entries, strict=True):
        if key not in model:
            assert entry == {"found": False}, key
            continue
        n, version = model[key]
        assert (entry["found"], entry["value"], entry["version"]) == (True, {"n": n}, version)
        assert entry["hash"] == codec.hash_tree(codec.decode_exact(f'{{"n":{n}}}'))
        assert entry == await store_on.call("state::get-entry", {"scope": scope, "key": key})


async def test_get_many_in_order_with_an_expired_key(store_on: StateStore) -> None:
    scope = fresh()
    await store_on.set(scope, "b", 2, topic="t", ttl_ms=HOUR_MS)
    await store_on.set(scope, "a", 1)
    await pass_time(await expiring(store_on, scope, ["c"]))
    entries = await store_on.get_many(scope, ["c", "b", "x", "a", "b"])
    assert [e.get("value") for e in entries] == [None, 2, None, 1, 2]
    assert entries[0] == entries[2] == {"found": False}
    assert entries[1]["topic"] == "t" and entries[1]["expires_at"] is not None


@SETTINGS
@given(keys=st.lists(KEYS, max_size=30, unique=True), prefix=KEYS,
       limit=st.integers(1, 4))
async def test_delete_by_prefix_resumes_to_completion(
        store_on: StateStore, keys: list[str], prefix: str, limit: int) -> None:
    scope = fresh()
    for i, key in enumerate(keys):
        await store_on.set(scope, key, i)
    matching = sorted((k for k in keys if k.startswith(prefix)), key=str.encode)
    after = (await store_on.events(scope))[-1].revision if keys else "-"
    deleted, calls, more = 0, 0, True
    while more:
        result = await store_on.call("state::delete-by-prefix",
                                     {"scope": scope, "prefix": prefix, "limit": limit})
        assert result["deleted"] <= limit
        deleted += result["deleted"]
        more = result["more"]
        calls += 1
        assert calls <= len(matching) // limit + 1, "more never ends"
    assert deleted == len(matching)
    events = await store_on.events(scope, after)
    assert [(e.type, e.key) for e in events] == [("state:deleted", k) for k in matching]
    assert [int(bytes(e.old_value)) for e in events] == [keys.index(k) for k in matching]
    rest = sorted((k for k in keys if not k.startswith(prefix)), key=str.encode)
    assert await store_on.list_keys(scope) == rest


async def test_a_retried_delete_by_prefix_gets_its_reply_and_deletes_no_more(
        store_on: StateStore) -> None:
    """Delivered twice (a retry, a redelivery), one bus call deletes once: the second gets
    the first's reply, and a key written with the prefix in between stays."""
    scope = f"dp-{uuid.uuid4().hex[:6]}"
    for key in ("job-1", "job-2", "other"):
        await store_on.set(scope, key, 1)
    body = msgspec.json.encode({"scope": scope, "prefix": "job-"})
    bus = CallContext(call_id=uuid.uuid4().hex, call_digest="2" * 40)
    state = store_on.state
    first = await state.execute(functions.prepare(state, "state::delete-by-prefix", body, bus))
    await store_on.set(scope, "job-3", 1)
    again = await state.execute(functions.prepare(state, "state::delete-by-prefix", body, bus))
    assert msgspec.json.encode(first) == msgspec.json.encode(again) == \
        b'{"deleted":2,"more":false}'
    assert await store_on.list_keys(scope) == ["job-3", "other"]
