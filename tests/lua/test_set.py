"""Every state function against real Redis: results, error codes and the events written."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from stateworker import StateError, StateStore

pytestmark = pytest.mark.anyio


async def events(store: StateStore, scope: str) -> list[tuple[str, str, Any, Any, int]]:
    return [
        (e.type, e.key, msgspec.json.decode(e.old_value), msgspec.json.decode(e.new_value),
         e.version)
        for e in await store.events(scope)
    ]


async def error_of(store: StateStore, fn: str, body: Any) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call(fn, body)
    return caught.value


async def test_get_missing_is_null_and_writes_no_event(store: StateStore, scope: str) -> None:
    assert await store.call("state::get", {"scope": scope, "key": "nope"}) is None
    assert await events(store, scope) == []


async def test_set_creates_then_updates(store: StateStore, scope: str) -> None:
    first = await store.call("state::set", {"scope": scope, "key": "k", "value": {"a": 1}})
    assert first["old_value"] is None and first["new_value"] == {"a": 1}
    assert first["version"] == 1 and first["created"] is True
    second = await store.call("state::set", {"scope": scope, "key": "k", "data": [1, 2]})
    assert second["old_value"] == {"a": 1} and second["new_value"] == [1, 2]
    assert second["version"] == 2 and second["created"] is False
    assert await store.call("state::get", {"scope": scope, "key": "k"}) == [1, 2]
    assert await events(store, scope) == [
        ("state:created", "k", None, {"a": 1}, 1),
        ("state:updated", "k", {"a": 1}, [1, 2], 2),
    ]


async def test_stored_null_is_present(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": None})
    again = await store.call("state::set", {"scope": scope, "key": "k", "value": None})
    assert again["created"] is False and again["version"] == 2
    assert [e[0] for e in await events(store, scope)] == ["state:created", "state:updated"]


async def test_set_records_writer_from_context(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1},
                     caller="orders", context={"execution_id": "exec-7"})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["updated_by"] == "exec-7"
    (event,) = await store.events(scope)
    assert event.by == "exec-7"
    await store.call("state::set", {"scope": scope, "key": "k", "value": 2}, caller="orders")
    assert (await store.call("state::get-entry", {"scope": scope, "key": "k"}))["updated_by"] == "orders"


async def test_set_expected_version_and_create_only(store: StateStore, scope: str) -> None:
    body = {"scope": scope, "key": "k", "value": 1, "expected_version": 0}
    assert (await store.call("state::set", body))["version"] == 1
    err = await error_of(store, "state::set", body)
    assert err.code == "CONFLICT"
    assert err.details == {"expected_version": 0, "current_version": 1}
    assert "expected_version 0" in err.message and "current version 1" in err.message
    ok = await store.call("state::set", {**body, "value": 2, "expected_version": 1})
    assert ok["version"] == 2
    err = await error_of(store, "state::set", {"scope": scope, "key": "k", "value": 3,
                                               "create_only": True})
    assert err.code == "CONFLICT" and err.details["current_version"] == 2
    assert await store.call("state::get", {"scope": scope, "key": "k"}) == 2
    assert len(await store.events(scope)) == 2  # no event for the two conflicts


async def test_set_topic_and_ttl_are_cleared_when_omitted(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1, "topic": "t",
                                    "ttl_ms": 60_000})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["topic"] == "t" and entry["expires_at"] is not None
    await store.call("state::set", {"scope": scope, "key": "k", "value": 2})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["topic"] is None and entry["expires_at"] is None


async def test_set_result_hash_matches_get_entry(store: StateStore, scope: str) -> None:
    result = await store.call("state::set", {"scope": scope, "key": "k", "value": {"last_id": 123}})
    assert result["hash"] == "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["hash"] == result["hash"] and entry["version"] == 1


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


async def test_list_and_list_keys_in_byte_order(store: StateStore, scope: str) -> None:
    assert await store.call("state::list", {"scope": scope}) == []
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": []}
    for key in ["b", "a", "é", "Z", "a:b", ""]:
        await store.call("state::set", {"scope": scope, "key": key, "value": key})
    expected = sorted(["b", "a", "é", "Z", "a:b", ""], key=str.encode)
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": expected}
    assert await store.call("state::list", {"scope": scope}) == expected


async def test_list_groups(store: StateStore, scope: str) -> None:
    other = scope + "-other"
    await store.call("state::set", {"scope": other, "key": "k", "value": 1})
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1})
    assert await store.call("state::list_groups", {}) == {"groups": sorted([scope, other])}
    await store.call("state::delete", {"scope": other, "key": "k"})
    assert await store.call("state::list_groups", {}) == {"groups": [scope]}


async def test_compare_and_set(store: StateStore, scope: str) -> None:
    absent = {"scope": scope, "key": "k", "value": {"n": 1}}
    assert await store.call("state::compare-and-set", absent) == {"swapped": True}
    assert await store.call("state::compare-and-set", absent) == {
        "swapped": False, "current": {"n": 1}}
    # deep equality ignores key order; 1 and 1.0 differ
    swap = {"scope": scope, "key": "k", "expected": {"n": 1.0}, "value": {"n": 2, "m": 0}}
    assert (await store.call("state::compare-and-set", swap))["swapped"] is False
    swap = {"scope": scope, "key": "k", "expected": {"n": 1}, "value": {"n": 2, "m": 0}}
    assert await store.call("state::compare-and-set", swap) == {"swapped": True}
    reordered = {"scope": scope, "key": "k", "expected": {"m": 0, "n": 2}, "value": 3}
    assert await store.call("state::compare-and-set", reordered) == {"swapped": True}
    assert await events(store, scope) == [
        ("state:created", "k", None, {"n": 1}, 1),
        ("state:updated", "k", {"n": 1}, {"n": 2, "m": 0}, 2),
        ("state:updated", "k", {"n": 2, "m": 0}, 3, 3),
    ]


async def test_compare_and_set_treats_stored_null_as_absent(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": None})
    body = {"scope": scope, "key": "k", "expected": None, "value": 1}
    assert await store.call("state::compare-and-set", body) == {"swapped": True}
    assert await store.call("state::compare-and-set", body) == {"swapped": False, "current": 1}


async def test_get_entry(store: StateStore, scope: str) -> None:
    assert await store.call("state::get-entry", {"scope": scope, "key": "k"}) == {"found": False}
    assert await store.call("state::get-entry", {"scope": scope, "key": "k", "default": []}) == {
        "found": False, "value": []}
    err = await error_of(store, "state::get-entry",
                         {"scope": scope, "key": "k", "default": 1, "required": True})
    assert err.code == "NOT_FOUND" and "'k'" in err.message
    await store.call("state::set", {"scope": scope, "key": "k", "value": 5, "topic": "tp"})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k", "default": 0})
    (event,) = await store.events(scope)
    assert entry["found"] is True and entry["value"] == 5 and entry["version"] == 1
    assert entry["topic"] == "tp" and entry["updated_by"] is None
    assert entry["revision"] == event.revision
    assert entry["created_at"] == entry["updated_at"]
    assert entry["created_at"].endswith("Z") and len(entry["created_at"]) == 24


@pytest.mark.parametrize("fn", ["state::get", "state::set", "state::delete", "state::list",
                                "state::list_keys", "state::compare-and-set",
                                "state::get-entry"])
async def test_reserved_scope_rejected(store: StateStore, fn: str) -> None:
    err = await error_of(store, fn, {"scope": "state_barrier", "key": "k", "value": 1})
    assert err.code == "RESERVED_SCOPE" and "state_barrier" in err.message


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"key": "k", "value": 1}, "$"),
        ({"scope": 1, "key": "k", "value": 1}, "$.scope"),
        ({"scope": "s", "key": None, "value": 1}, "$.key"),
        ({"scope": "s", "key": "k"}, "$.value"),
        ({"scope": "s", "key": "k", "value": 1, "ttl_ms": "x"}, "$.ttl_ms"),
        ({"scope": "s", "key": "k", "value": 1, "ttl_ms": 0}, "$.ttl_ms"),
        ({"scope": "s", "key": "k", "value": 1, "expected_version": -1}, "$.expected_version"),
        ({"scope": "s", "key": "k", "value": 1, "create_only": "yes"}, "$.create_only"),
    ],
)
async def test_set_invalid_request_names_the_path(
    store: StateStore, body: dict[str, Any], path: str
) -> None:
    err = await error_of(store, "state::set", body)
    assert err.code == "INVALID_REQUEST"
    assert err.details["path"] == path
    assert err.message.startswith(path)


async def test_body_must_be_an_object(store: StateStore) -> None:
    for body in (b"[]", b"1", b"not json", b""):
        err = await error_of(store, "state::get", body)
        assert err.code == "INVALID_REQUEST" and err.details["path"] == "$"


async def test_unknown_fields_ignored_and_unknown_function(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1, "extra": [1]})
    err = await error_of(store, "state::nope", {})
    assert err.code == "UNKNOWN_FUNCTION" and "state::nope" in err.message


async def test_key_and_value_limits(redis_server: Any, prefix: str, scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, max_value_bytes=10,
                               max_key_bytes=4) as store:
        err = await error_of(store, "state::set", {"scope": scope[:4], "key": "12345", "value": 1})
        assert err.code == "KEY_TOO_LONG"
        assert err.details == {"path": "$.key", "size": 5, "limit": 4}
        assert "5 bytes" in err.message and "4 bytes" in err.message
        err = await error_of(store, "state::set", {"scope": "ééé", "key": "k", "value": 1})
        assert err.code == "KEY_TOO_LONG" and err.details["path"] == "$.scope"
        ok = await store.call("state::set", {"scope": "s", "key": "k", "value": "12345678"})
        assert ok["version"] == 1  # exactly 10 bytes of JSON is allowed
        err = await error_of(store, "state::set", {"scope": "s", "key": "k", "value": "123456789"})
        assert err.code == "VALUE_TOO_LARGE"
        assert err.details["size"] == 11 and err.details["limit"] == 10
        assert await store.call("state::get", {"scope": "s", "key": "k"}) == "12345678"


async def test_compare_and_set_and_diff_keep_topic_and_expiry(store: StateStore,
                                                              scope: str) -> None:
    await store.set(scope, "k", 1, topic="t", ttl_ms=60_000)
    before = await store.get_entry(scope, "k")
    assert (await store.compare_and_set(scope, "k", 2, expected=1)).swapped is True
    await store.call("state::diff", {"scope": scope, "key": "k", "value": 3})
    after = await store.get_entry(scope, "k")
    assert (after.value, after.topic, after.expires_at) == (3, "t", before.expires_at)
