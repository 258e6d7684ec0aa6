"""Values round-trip exactly through Redis, and `hash` is the reference canonical hash."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings

from stateworker import StateStore
from tests.jsontext import deep, exact_load, json_trees, reference_hash, to_text

pytestmark = pytest.mark.anyio


def body(scope: str, key: str, value_text: str) -> bytes:
    return (f'{{"scope":{msgspec.json.encode(scope).decode()},'
            f'"key":{msgspec.json.encode(key).decode()},"value":{value_text}}}').encode()


async def check_round_trip(store: StateStore, scope: str, tree: Any) -> None:
    text = to_text(tree, " ")
    result = exact_load(await store.call_json("state::set", body(scope, "k", text)))
    fields = dict(result)
    assert fields["new_value"] == exact_load(to_text(tree))
    assert fields["hash"] == reference_hash(tree)
    got = await store.call_json("state::get", body(scope, "k", "0"))
    assert exact_load(got) == exact_load(to_text(tree))
    entry = dict(exact_load(await store.call_json("state::get-entry", body(scope, "k", "0"))))
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
