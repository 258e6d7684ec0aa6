"""state::set, state::compare-and-set and state::diff (set.lua) against real Redis: results,
error codes, limits and the events written; values round-trip exactly, and `hash` is the
reference canonical hash."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from stateworker import StateError, StateStore
from tests.calls import error_of, events
from tests.jsontext import deep, exact_load, json_trees, reference_hash, to_text
from tests.lua.ttl import HOUR_MS, stored_expiry

pytestmark = pytest.mark.anyio


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


async def test_create_only_conflict_names_create_only(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", 1)
    await store.set(scope, "k", 2)
    with pytest.raises(StateError) as caught:
        await store.set(scope, "k", 3, create_only=True)
    assert caught.value.code == "CONFLICT"
    assert caught.value.message.startswith('create_only: key "k"')
    assert "already exists (version 2)" in caught.value.message
    assert "expected_version" not in caught.value.message


async def test_create_only_with_an_expected_version_holds_both(store: StateStore,
                                                               scope: str) -> None:
    """`create_only` (the key absent) and `expected_version: N` (the key at version N) are two
    conditions, each a CONFLICT when it fails: with N >= 1 they never both hold, so neither
    an absent key (version 0, not N) nor one at version N (not absent) is written; with
    N = 0 they agree. (create_only once replaced expected_version: an absent key was
    created by a write that expected version 1.)"""
    body = {"scope": scope, "key": "k", "value": 1, "create_only": True, "expected_version": 1}
    absent = await error_of(store, "state::set", body)
    assert absent.code == "CONFLICT"
    assert absent.details == {"expected_version": 1, "current_version": 0}
    assert "create_only and expected_version 1" in absent.message
    assert "current version 0" in absent.message
    assert (await store.call("state::set", {**body, "expected_version": 0}))["version"] == 1
    present = await error_of(store, "state::set", body)
    assert present.details == {"expected_version": 1, "current_version": 1}
    tx = await error_of(store, "state::transaction", {"scope": scope, "ops": [
        {"op": "set", "key": "new", "value": 1, "create_only": True, "expected_version": 1}]})
    assert tx.code == "CONFLICT" and tx.details["current_version"] == 0
    assert await store.call("state::list_keys", {"scope": scope}) == {"keys": ["k"]}
    assert len(await store.events(scope)) == 1


async def test_set_topic_and_ttl_are_cleared_when_omitted(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1, "topic": "t",
                                    "ttl_ms": 60_000})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["topic"] == "t" and entry["expires_at"] is not None
    await store.call("state::set", {"scope": scope, "key": "k", "value": 2})
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["topic"] is None and entry["expires_at"] is None


async def test_set_without_ttl_clears_expiry(store: StateStore, scope: str) -> None:
    await store.set(scope, "k", "first", ttl_ms=HOUR_MS)
    assert await stored_expiry(store, scope, "k") is not None
    await store.set(scope, "k", "kept")
    assert await stored_expiry(store, scope, "k") is None
    assert (await store.get_entry(scope, "k")).expires_at is None


async def test_set_result_hash_matches_get_entry(store: StateStore, scope: str) -> None:
    result = await store.call("state::set", {"scope": scope, "key": "k", "value": {"last_id": 123}})
    assert result["hash"] == "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"
    entry = await store.call("state::get-entry", {"scope": scope, "key": "k"})
    assert entry["hash"] == result["hash"] and entry["version"] == 1


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"key": "k", "value": 1}, "$.scope"),
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


async def test_limits_are_named(store: StateStore, scope: str) -> None:
    deep = "[" * 600 + "]" * 600
    with pytest.raises(StateError) as caught:
        await store.call_json("state::set", f'{{"scope":"{scope}","key":"k","value":{deep}}}')
    assert caught.value.code == "INVALID_REQUEST"
    assert "512" in caught.value.message and caught.value.details["limit"] == 512
    long_int = "9" * 4301
    with pytest.raises(StateError) as caught:
        await store.call_json("state::set",
                              f'{{"scope":"{scope}","key":"k","value":[{long_int}]}}')
    assert "4300" in caught.value.message and caught.value.details["limit"] == 4300
    fits = "[" * 512 + "]" * 512
    await store.call_json("state::set", f'{{"scope":"{scope}","key":"k","value":{fits}}}')
    assert (await store.call("state::get", {"scope": scope, "key": "k"})) is not None
    await store.call_json("state::set",
                          f'{{"scope":"{scope}","key":"n","value":{"9" * 4300}}}')
    assert await store.call_json("state::get", f'{{"scope":"{scope}","key":"n"}}') == b"9" * 4300


# ---- compare-and-set and diff ----------------------------------------------------------------
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


async def test_diff(store: StateStore, scope: str) -> None:
    first = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"a": 1, "b": 2}})
    assert first["changed"] is True and first["found_previous"] is False and first["version"] == 1
    same = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"b": 2, "a": 1}})
    assert same["changed"] is False and same["previous_version"] == 1
    assert same["previous"] == {"a": 1, "b": 2}
    changed = await store.call("state::diff", {"scope": scope, "key": "k", "value": {"a": 2}})
    assert changed == {"changed": True, "found_previous": True, "previous_version": 1,
                       "previous": {"a": 1, "b": 2}, "version": 2, "hash": changed["hash"]}
    dry = await store.call("state::diff", {"scope": scope, "key": "k", "value": 3,
                                           "update": False})
    assert dry["changed"] is True and "version" not in dry
    assert await store.get(scope, "k") == {"a": 2}
    with pytest.raises(StateError) as caught:
        await store.call("state::diff", {"scope": scope, "key": "k", "value": 4,
                                         "expected_version": 1})
    assert caught.value.code == "CONFLICT"
    assert len(await store.events(scope)) == 2


async def test_compare_and_set_and_diff_keep_topic_and_expiry(store: StateStore,
                                                              scope: str) -> None:
    await store.set(scope, "k", 1, topic="t", ttl_ms=60_000)
    before = await store.get_entry(scope, "k")
    assert (await store.compare_and_set(scope, "k", 2, expected=1)).swapped is True
    await store.call("state::diff", {"scope": scope, "key": "k", "value": 3})
    after = await store.get_entry(scope, "k")
    assert (after.value, after.topic, after.expires_at) == (3, "t", before.expires_at)


# ---- values round-trip exactly ---------------------------------------------------------------
def body(scope: str, key: str, value_text: str) -> bytes:
    return (f'{{"scope":{msgspec.json.encode(scope).decode()},'
            f'"key":{msgspec.json.encode(key).decode()},"value":{value_text}}}').encode()


async def check_round_trip(store: StateStore, scope: str, tree: Any) -> None:
    text = to_text(tree, " ")
    result = exact_load(await store.call_json("state::set", body(scope, "k", text)))
    fields = dict(result)
    assert fields["new_value"] == exact_load(to_text(tree))
    assert fields["hash"] == reference_hash(tree)
    address = msgspec.json.encode({"scope": scope, "key": "k"})
    got = await store.call_json("state::get", address)
    assert exact_load(got) == exact_load(to_text(tree))
    entry = dict(exact_load(await store.call_json("state::get-entry", address)))
    assert entry["value"] == exact_load(to_text(tree))
    assert entry["hash"] == reference_hash(tree)
    (event,) = (await store.events(scope))[-1:]
    assert exact_load(bytes(event.new_value)) == exact_load(to_text(tree))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=json_trees)
async def test_any_json_round_trips_through_redis(
    store: StateStore, scope: str, tree: Any
) -> None:
    await check_round_trip(store, scope, tree)


@pytest.mark.parametrize(
    "text",
    ["[]", "{}", "9007199254740993", "-9223372036854775809", "1.2300", "1e2", "1E-7",
     '{"z":1,"a":{"y":[],"b":{}}}', '"\\u00e9\\n\\u2028 <&>"', '{"\\u00fcber":"\\ud83d\\ude00"}',
     "null", "true", '""'],
)
async def test_examples_round_trip(store: StateStore, scope: str, text: str) -> None:
    await check_round_trip(store, scope, exact_load(text))


async def test_deep_nesting_round_trips(store: StateStore, scope: str) -> None:
    await check_round_trip(store, scope, deep(100))


async def test_known_hash_through_redis(store: StateStore, scope: str) -> None:
    result = await store.set(scope, "k", {"last_id": 123})
    assert result.hash == "c475a5436a1e85bfcf9edbcefb55dd6389d937e60d8e8ba17fb5791e61a5c689"


async def test_python_types_round_trip(store: StateStore, scope: str) -> None:
    value = {
        "aware": dt.datetime(2026, 11, 29, 15, 4, 5, 123456,
                             tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
        "naive": dt.datetime(2026, 11, 29, 15, 4, 5),
        "date": dt.date(2026, 2, 28),
        "time": dt.time(23, 59, 59, 1),
        "money": decimal.Decimal("1.2300"),
        "big": decimal.Decimal("-1E+30"),
        "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "raw": b"\x00\x01\xfe\xff",
        "nested": [dt.date(2000, 1, 1), {"d": decimal.Decimal("0.10")}],
    }
    await store.set(scope, "k", value)
    back = await store.get(scope, "k")
    assert back == value
    assert back["aware"].utcoffset() == dt.timedelta(hours=5, minutes=30)
    assert back["naive"].tzinfo is None
    assert str(back["money"]) == "1.2300"
    assert (await store.get_entry(scope, "k")).value == value
    assert (await store.compare_and_set(scope, "k", 1, expected=value)).swapped is True
