"""state::delete (delete.lua) against real Redis: the value it returns and the event written,
and `expected_version` (CONFLICT naming both versions, nothing deleted and no event), through
every status the script returns."""

from __future__ import annotations

import hashlib
import uuid

import msgspec
import pytest

from stateworker import StateClient, StateStore
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import Conflict, DeadlineExceeded, InvalidRequest
from stateworker.state import functions
from tests.calls import error_of, events

pytestmark = pytest.mark.anyio


async def test_delete(store: StateStore, scope: str) -> None:
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) is None
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v"})
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) == "v"
    assert await store.call("state::get", {"scope": scope, "key": "k"}) is None
    assert await store.call("state::delete", {"scope": scope, "key": "k"}) is None
    assert await events(store, scope) == [
        ("state:created", "k", None, "v", 1),
        ("state:deleted", "k", "v", None, 1),
    ]
    again = await store.call("state::set", {"scope": scope, "key": "k", "value": "w"})
    assert again["version"] == 1 and again["created"] is True


async def test_expected_version_deletes_only_that_version(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v1"})
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v2"})
    stale = await error_of(store, "state::delete",
                           {"scope": scope, "key": "k", "expected_version": 1})
    assert stale.code == "CONFLICT"
    assert stale.details == {"expected_version": 1, "current_version": 2}
    assert "expected_version 1" in stale.message and "current version 2" in stale.message
    assert await store.get(scope, "k") == "v2"  # nothing deleted, no event
    assert [e[0] for e in await events(store, scope)] == ["state:created", "state:updated"]

    body = {"scope": scope, "key": "k", "expected_version": 2}
    assert await store.call("state::delete", body) == "v2"
    assert await store.get(scope, "k") is None
    assert (await events(store, scope))[-1] == ("state:deleted", "k", "v2", None, 2)


async def test_expected_version_of_a_missing_key_is_a_conflict_at_version_0(
        store: StateStore, scope: str) -> None:
    missing = await error_of(store, "state::delete",
                             {"scope": scope, "key": "k", "expected_version": 3})
    assert missing.code == "CONFLICT"
    assert missing.details == {"expected_version": 3, "current_version": 0}
    assert "expected_version 3" in missing.message and "current version 0" in missing.message
    assert await events(store, scope) == []


@pytest.mark.parametrize("version", [0, -1])
async def test_expected_version_below_1_is_refused(store: StateStore, scope: str,
                                                   version: int) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v"})
    refused = await error_of(store, "state::delete",
                             {"scope": scope, "key": "k", "expected_version": version})
    assert refused.code == "INVALID_REQUEST"
    assert refused.details == {"path": "$.expected_version", "limit": 1}
    assert refused.message.startswith("$.expected_version: must be 1 or more")
    assert refused.message.endswith(f"got {version}")
    assert await store.get(scope, "k") == "v"
    assert len(await events(store, scope)) == 1


def _bus(body: dict[str, object], call_id: str, deadline_ms: int | None = None,
         ) -> tuple[bytes, CallContext]:
    """A bus call as the runtime prepares it (its digest: SHA-1 of function and body)."""
    raw = msgspec.json.encode(body)
    digest = hashlib.sha1(b"state::delete\0" + raw).hexdigest()
    return raw, CallContext(call_id=call_id, call_digest=digest, deadline_ms=deadline_ms)


async def _run(store: StateStore, body: bytes, ctx: CallContext) -> object:
    return await store.state.execute(functions.prepare(store.state, "state::delete", body, ctx))


async def test_a_retried_conflict_gets_its_recorded_reply(store: StateStore,
                                                          scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v1"})
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v2"})
    call = _bus({"scope": scope, "key": "k", "expected_version": 1}, uuid.uuid4().hex)
    with pytest.raises(Conflict) as first:
        await _run(store, *call)
    # The duplicate is answered from the call's record, not run again.
    with pytest.raises(Conflict) as again:
        await _run(store, *call)
    assert again.value.details == first.value.details == {"expected_version": 1,
                                                          "current_version": 2}
    assert await store.get(scope, "k") == "v2"
    deleting = _bus({"scope": scope, "key": "k", "expected_version": 2}, uuid.uuid4().hex)
    assert await _run(store, *deleting) == msgspec.Raw(b'"v2"')
    assert await _run(store, *deleting) == msgspec.Raw(b'"v2"')
    assert [e[0] for e in await events(store, scope)] == [
        "state:created", "state:updated", "state:deleted"]


async def test_a_call_past_its_deadline_deletes_nothing(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": "v"})
    late = _bus({"scope": scope, "key": "k", "expected_version": 1}, uuid.uuid4().hex,
                deadline_ms=now_ms() - 1000)
    with pytest.raises(DeadlineExceeded):
        await _run(store, *late)
    assert await store.get(scope, "k") == "v"


async def test_the_typed_faces_take_expected_version(store: StateStore, client: StateClient,
                                                     scope: str) -> None:
    await store.set(scope, "a", 1)
    await store.set(scope, "b", 1)
    with pytest.raises(Conflict):
        await store.delete(scope, "a", expected_version=2)
    with pytest.raises(Conflict):
        await client.delete(scope, "b", expected_version=2)
    with pytest.raises(InvalidRequest):
        await client.delete(scope, "b", expected_version=0)
    assert await store.delete(scope, "a", expected_version=1) == 1
    assert await client.delete(scope, "b", expected_version=1) == 1
    assert await store.list_keys(scope) == []
