"""state::barrier against real Redis: every rule and message of the fan-in gate (counts and
named sets, repeated and unknown keys, key_from and carry, the configs it refuses, a
completed barrier, an expect that differs from the first arrival's, the arrival token, the
size limits) and that it writes no change event."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import anyio
import msgspec
import pytest

from stateworker import StateError, StateStore
from stateworker.clock import now_ms
from stateworker.settings import Settings
from stateworker.state.reactive.barrier import MAX_PAYLOAD_BYTES, parse_condition
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


def new_id() -> str:
    return f"b-{uuid.uuid4().hex[:8]}"


async def arrive(store: StateStore, event: Any, config: Any) -> dict[str, Any]:
    result: dict[str, Any] = await store.call(
        "state::barrier", {"event": event, "condition_config": config})
    return result


async def refused(store: StateStore, body: Any) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::barrier", body)
    return caught.value


def skip(reason: str) -> dict[str, Any]:
    return {"decision": "skip", "reason": reason}


# ---- counts ------------------------------------------------------------------------------------
async def test_a_count_skips_until_the_last_arrival_which_carries_every_event(
        store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 3}
    assert await arrive(store, {"key": "b", "n": 2}, config) == skip(
        f"barrier `{bid}`: 1/3 arrived, waiting on 2 more")
    assert await arrive(store, {"key": "a", "n": 1}, config) == skip(
        f"barrier `{bid}`: 2/3 arrived, waiting on 1 more")
    assert await arrive(store, {"key": "c", "n": 3}, config) == {
        "decision": "allow", "reason": f"barrier `{bid}` complete (3/3)",
        "payload": {"results": {"a": {"key": "a", "n": 1}, "b": {"key": "b", "n": 2},
                                "c": {"key": "c", "n": 3}}}}


async def test_results_are_in_byte_order_of_their_keys(store: StateStore) -> None:
    bid, keys = new_id(), ["é", "z", "A", "", "a:b", "a"]
    body = {"condition_config": {"id": bid, "expect": len(keys), "carry": "/v"}}
    for key in keys[:-1]:
        await store.call("state::barrier", {**body, "event": {"key": key, "v": 1}})
    text = await store.call_json("state::barrier", msgspec.json.encode(
        {**body, "event": {"key": "a", "v": 1}}))
    ordered = sorted(keys, key=str.encode)  # "", "A", "a", "a:b", "z", "é"
    results = ",".join(f'{msgspec.json.encode(k).decode()}:1' for k in ordered)
    assert f'"payload":{{"results":{{{results}}}}}'.encode() in text


async def test_an_expect_of_one_allows_the_first_arrival(store: StateStore) -> None:
    bid = new_id()
    assert await arrive(store, {"key": "only"}, {"id": bid, "expect": 1, "carry": "/key"}) == {
        "decision": "allow", "payload": {"results": {"only": "only"}},
        "reason": f"barrier `{bid}` complete (1/1)"}
    named = new_id()
    assert (await arrive(store, {"key": "x"}, {"id": named, "expect": ["x"]}))["decision"] == \
        "allow"


async def test_a_repeated_key_counts_once_and_its_last_value_is_kept(store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 2, "carry": "/v"}
    await arrive(store, {"key": "a", "v": "first"}, config)
    assert await arrive(store, {"key": "a", "v": "second"}, config) == skip(
        "`a` already counted, still 1/2")
    assert await arrive(store, {"key": "a", "v": "third"}, config) == skip(
        "`a` already counted, still 1/2")
    done = await arrive(store, {"key": "b", "v": "b"}, config)
    assert done["payload"] == {"results": {"a": "third", "b": "b"}}


async def test_a_complete_barrier_skips_every_later_arrival_and_is_not_rearmed(
        store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 1}
    assert (await arrive(store, {"key": "a"}, config))["decision"] == "allow"
    for event in ({"key": "a"}, {"key": "b"}, {"key": "c"}):
        assert await arrive(store, event, config) == skip(f"barrier `{bid}` already complete")
    named = new_id()
    await arrive(store, {"key": "x"}, {"id": named, "expect": ["x"]})
    assert await arrive(store, {"key": "y"}, {"id": named, "expect": ["x"]}) == skip(
        f"barrier `{named}` already complete")


# ---- named sets --------------------------------------------------------------------------------
async def test_a_named_set_names_the_missing_keys_and_ignores_unknown_ones(
        store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": ["c", "a", "b"], "carry": "/v"}
    assert await arrive(store, {"key": "stranger", "v": 0}, config) == skip(
        f"`stranger` is not one of the keys barrier `{bid}` expects: not counted (0/3)")
    assert await arrive(store, {"key": "b", "v": 2}, config) == skip(
        f"barrier `{bid}`: 1/3 arrived, waiting on 2 more: `a`, `c`")
    assert await arrive(store, {"key": "zz", "v": 0}, config) == skip(
        f"`zz` is not one of the keys barrier `{bid}` expects: not counted (1/3)")
    assert await arrive(store, {"key": "b", "v": 22}, config) == skip(
        "`b` already counted, still 1/3")
    assert await arrive(store, {"key": "a", "v": 1}, config) == skip(
        f"barrier `{bid}`: 2/3 arrived, waiting on 1 more: `c`")
    assert await arrive(store, {"key": "c", "v": 3}, config) == {
        "decision": "allow", "payload": {"results": {"a": 1, "b": 22, "c": 3}},
        "reason": f"barrier `{bid}` complete (3/3)"}


async def test_a_large_named_set_names_its_first_ten_missing_keys(store: StateStore) -> None:
    bid = new_id()
    keys = [f"k{i:02d}" for i in range(25)]
    config = {"id": bid, "expect": list(reversed(keys))}
    arrived = ["k00", "k03", "k24", "k11"]
    for key in arrived:
        reply = await arrive(store, {"key": key}, config)
    missing = [k for k in keys if k not in arrived]
    shown = ", ".join(f"`{k}`" for k in missing[:10])
    assert reply == skip(f"barrier `{bid}`: 4/25 arrived, waiting on 21 more: {shown}, …")
    for key in missing[:-2]:
        await arrive(store, {"key": key}, config)
    assert await arrive(store, {"key": missing[-1]}, config) == skip(
        f"barrier `{bid}`: 24/25 arrived, waiting on 1 more: `{missing[-2]}`")
    done = await arrive(store, {"key": missing[-2]}, config)
    assert list(done["payload"]["results"]) == keys


async def test_the_order_of_a_named_set_does_not_make_another_barrier(store: StateStore) -> None:
    bid = new_id()
    await arrive(store, {"key": "a"}, {"id": bid, "expect": ["a", "b"]})
    done = await arrive(store, {"key": "b"}, {"id": bid, "expect": ["b", "a"]})
    assert done["decision"] == "allow"


# ---- key_from and carry -------------------------------------------------------------------------
@pytest.mark.parametrize(("target", "key"), [
    ("shard-1", "shard-1"),
    ("", ""),
    (7, "7"),
    (1.50, "1.5"),
    (True, "true"),
    ([1, "a"], '[1,"a"]'),
    ({"b": 1, "a": []}, '{"b":1,"a":[]}'),
])
async def test_key_from_takes_a_string_as_is_and_any_other_value_as_its_json(
        store: StateStore, target: Any, key: str) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 2, "key_from": "/new_value/shard", "carry": ""}
    event = {"key": "ignored", "new_value": {"shard": target}}
    await arrive(store, event, config)
    assert await arrive(store, event, config) == skip(f"`{key}` already counted, still 1/2")
    done = await arrive(store, {"new_value": {"shard": "other"}}, config)
    assert done["payload"]["results"][key] == event


async def test_key_from_follows_escapes_and_array_indexes(store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 1, "key_from": "/a~1b/~0/1", "carry": "/n"}
    done = await arrive(store, {"a/b": {"~": ["x", "y"]}, "n": 5}, config)
    assert done["payload"] == {"results": {"y": 5}}


@pytest.mark.parametrize("event", [
    {"other": 1},  # missing
    {"key": None},  # null
    None,
    "key",
    [1, 2],
])
async def test_an_event_without_an_arrival_key_is_refused(store: StateStore, event: Any) -> None:
    bid = new_id()
    body = {"event": event, "condition_config": {"id": bid, "expect": 2}}
    err = await refused(store, body)
    assert err.code == "INVALID_REQUEST"
    assert "no arrival key at `/key`" in err.message
    assert err.details == {"path": "$.event", "pointer": "/key"}
    # Nothing was counted: the next two arrivals complete it.
    await arrive(store, {"key": "a"}, {"id": bid, "expect": 2})
    assert (await arrive(store, {"key": "b"}, {"id": bid, "expect": 2}))["decision"] == "allow"


@pytest.mark.parametrize(("pointer", "event"), [
    ("/key/0", {"key": "abc"}),  # a string has no members
    ("/list/01", {"list": ["x", "y"]}),  # no leading zeros
    ("/list/2", {"list": ["x", "y"]}),
    ("/list/-", {"list": ["x", "y"]}),
])
async def test_a_pointer_into_nothing_is_no_arrival_key(store: StateStore, pointer: str,
                                                        event: Any) -> None:
    err = await refused(store, {"event": event, "condition_config": {
        "id": new_id(), "expect": 2, "key_from": pointer}})
    assert err.code == "INVALID_REQUEST" and f"no arrival key at `{pointer}`" in err.message


async def test_an_event_left_out_has_no_arrival_key(store: StateStore) -> None:
    err = await refused(store, {"condition_config": {"id": new_id(), "expect": 2}})
    assert err.code == "INVALID_REQUEST" and "no arrival key at `/key`" in err.message


async def test_carry_keeps_exact_json_and_null_for_a_missing_target(store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 3, "carry": "/new_value"}
    exact = b'{"z":1.50,"a":[],"o":{},"big":9007199254740993,"e":1e2,"neg":-0}'
    await store.call_json("state::barrier", b'{"event":{"key":"a","new_value":' + exact +
                          b'},"condition_config":' + msgspec.json.encode(config) + b"}")
    await arrive(store, {"key": "b"}, config)  # no new_value: null
    text = await store.call_json("state::barrier", msgspec.json.encode(
        {"event": {"key": "c", "new_value": [None, False]}, "condition_config": config}))
    assert (b'"payload":{"results":{"a":' + exact + b',"b":null,"c":[null,false]}}') in text


async def test_carry_defaults_to_the_whole_event_exactly(store: StateStore) -> None:
    bid = new_id()
    event = b'{"type":"state","key":"k1","new_value":{"x":2.0,"l":[]},"version":3}'
    config = msgspec.json.encode({"id": bid, "expect": 1})
    text = await store.call_json("state::barrier", b'{"event": ' + event.replace(b",", b", ")
                                 + b',"condition_config":' + config + b"}")
    assert b'"payload":{"results":{"k1":' + event + b"}}" in text


# ---- configs -----------------------------------------------------------------------------------
BAD_CONFIGS: list[tuple[Any, str, str]] = [
    (None, "$.condition_config", "required"),
    ("x", "$.condition_config", "must be a JSON object"),
    ({"expect": 2}, "$.condition_config.id", "the field `id` is required"),
    ({"id": "b"}, "$.condition_config.expect", "the field `expect` is required"),
    ({"id": "", "expect": 2}, "$.condition_config.id", "must not be empty"),
    ({"id": 5, "expect": 2}, "$.condition_config.id", "Expected `str`"),
    ({"id": "x" * 1025, "expect": 2}, "$.condition_config.id", "limit of 1024 bytes"),
    ({"id": "b", "expect": 0}, "$.condition_config.expect", "between 1 and 10000"),
    ({"id": "b", "expect": 10001}, "$.condition_config.expect", "between 1 and 10000"),
    ({"id": "b", "expect": -3}, "$.condition_config.expect", "between 1 and 10000"),
    ({"id": "b", "expect": 2.0}, "$.condition_config.expect", "Expected `int | array`"),
    ({"id": "b", "expect": True}, "$.condition_config.expect", "Expected `int | array`"),
    ({"id": "b", "expect": "a"}, "$.condition_config.expect", "Expected `int | array`"),
    ({"id": "b", "expect": None}, "$.condition_config.expect", "Expected `int | array`"),
    ({"id": "b", "expect": []}, "$.condition_config.expect", "between 1 and 10000 keys"),
    ({"id": "b", "expect": [str(i) for i in range(10001)]}, "$.condition_config.expect",
     "between 1 and 10000 keys, got 10001"),
    ({"id": "b", "expect": ["a", "b", "a"]}, "$.condition_config.expect[2]",
     "`a` is listed twice"),
    ({"id": "b", "expect": ["a", 1]}, "$.condition_config.expect[1]", "Expected `str`"),
    ({"id": "b", "expect": ["k" * 1025]}, "$.condition_config.expect[0]",
     "limit of 1024 bytes"),
    ({"id": "b", "expect": 2, "key_from": "key"}, "$.condition_config.key_from",
     "`key` is not a JSON pointer"),
    ({"id": "b", "expect": 2, "key_from": "/a~2"}, "$.condition_config.key_from",
     "is not a JSON pointer"),
    ({"id": "b", "expect": 2, "key_from": 3}, "$.condition_config.key_from", "Expected `str`"),
    ({"id": "b", "expect": 2, "key_from": "/" + "k" * 1024}, "$.condition_config.key_from",
     "limit of 1024 bytes"),
    ({"id": "b", "expect": 2, "carry": "value"}, "$.condition_config.carry",
     "`value` is not a JSON pointer"),
    ({"id": "b", "expect": 2, "carry": ["/a"]}, "$.condition_config.carry",
     "Expected `str | null`"),
]


@pytest.mark.parametrize(("config", "path", "problem"), BAD_CONFIGS)
async def test_a_missing_or_bad_config_is_barrier_config_naming_the_field(
        store: StateStore, config: Any, path: str, problem: str) -> None:
    err = await refused(store, {"event": {"key": "a"}, "condition_config": config})
    assert err.code == "BARRIER_CONFIG"
    assert err.details["path"] == path
    assert path.removeprefix("$.") in err.message and problem in err.message, err.message


async def test_a_left_out_config_is_barrier_config(store: StateStore) -> None:
    err = await refused(store, {"event": {"key": "a"}})
    assert err.code == "BARRIER_CONFIG" and err.details == {"path": "$.condition_config"}


async def test_a_config_is_checked_at_registration_naming_where_it_sits() -> None:
    settings = Settings(max_key_bytes=8)
    with pytest.raises(StateError) as caught:
        parse_condition(settings, msgspec.Raw(b'{"id":"b","expect":["a","123456789"]}'),
                        "$.options.condition_config")
    assert caught.value.code == "BARRIER_CONFIG"
    assert caught.value.details == {"path": "$.options.condition_config.expect[1]",
                                    "size": 9, "limit": 8}
    with pytest.raises(StateError) as caught:
        parse_condition(settings, None, "$.options.condition_config")
    assert caught.value.details == {"path": "$.options.condition_config"}
    config = parse_condition(settings, b'{"id":"b","expect":["b","a"],"carry":"/v"}')
    assert (config.id, config.expect, config.key_from, config.carry) == \
        ("b", ("a", "b"), "/key", "/v")
    with pytest.raises(StateError) as caught:  # a misspelt `key_from` is never ignored
        parse_condition(settings, b'{"id":"b","expect":2,"key_form":"/k"}',
                        "$.options.condition_config")
    assert caught.value.code == "UNKNOWN_FIELD"
    assert caught.value.details == {"path": "$.options.condition_config.key_form",
                                    "nearest": "key_from"}


@pytest.mark.parametrize(("first", "then", "stored", "given"), [
    (2, 3, "2 arrivals", "3 arrivals"),
    (1, ["a"], "1 arrival", 'the keys ["a"]'),
    (["a", "b"], ["a", "c"], 'the keys ["a","b"]', 'the keys ["a","c"]'),
    (["a"], 1, 'the keys ["a"]', "1 arrival"),
])
async def test_an_expect_other_than_the_first_arrivals_is_barrier_config_naming_both(
        store: StateStore, first: Any, then: Any, stored: str, given: str) -> None:
    bid = new_id()
    await arrive(store, {"key": "a"}, {"id": bid, "expect": first})
    for _ in range(2):  # while collecting, and (for the one-key barriers) once complete
        err = await refused(store, {"event": {"key": "b"},
                                    "condition_config": {"id": bid, "expect": then}})
        assert err.code == "BARRIER_CONFIG"
        assert err.message == (
            f"$.condition_config.expect: barrier `{bid}` expects {stored} (fixed by its first "
            f"arrival), this arrival expects {given}; nothing was written (a new round needs "
            "a new id)")
        assert err.details == {"path": "$.condition_config.expect", "expected": stored,
                               "given": given}
    if first == 2:  # nothing was counted by the refused arrivals
        assert await arrive(store, {"key": "a"}, {"id": bid, "expect": 2}) == skip(
            "`a` already counted, still 1/2")


async def test_a_long_named_set_is_shortened_in_messages(store: StateStore) -> None:
    bid = new_id()
    keys = [f"key-{i:04d}" for i in range(500)]
    await arrive(store, {"key": "key-0000"}, {"id": bid, "expect": keys})
    err = await refused(store, {"event": {"key": "a"},
                                "condition_config": {"id": bid, "expect": 500}})
    stored = err.details["expected"]
    assert stored.startswith('the keys ["key-0000","key-0001",') and \
        stored.endswith("… (500 keys)") and len(stored) < 240


# ---- the arrival token -------------------------------------------------------------------------
async def test_the_completing_token_gets_the_same_allow_again(store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 2, "carry": "/v"}
    first = await store.barrier({"key": "a", "v": 1}, config, token="t:1")
    assert first.decision == "skip"
    done = await store.barrier({"key": "b", "v": 2}, config, token="t:2")
    assert done.decision == "allow" and done.payload == {"results": {"a": 1, "b": 2}}
    assert await store.barrier({"key": "b", "v": 2}, config, token="t:2") == done
    assert await store.barrier({"key": "zz"}, config, token="t:2") == done  # by token alone
    late = f"barrier `{bid}` already complete"
    assert (await store.barrier({"key": "b", "v": 2}, config, token="t:3")).reason == late
    assert (await store.barrier({"key": "b", "v": 2}, config)).reason == late
    # The token of an arrival that did not complete it: a skip again.
    again = await store.barrier({"key": "a", "v": 1}, config, token="t:1")
    assert (again.decision, again.reason) == ("skip", late)


async def test_a_completion_without_a_token_is_not_replayed_by_an_empty_one(
        store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 1}
    assert (await store.barrier({"key": "a"}, config)).decision == "allow"
    assert (await store.barrier({"key": "a"}, config, token="")).decision == "skip"


# ---- sizes -------------------------------------------------------------------------------------
async def test_an_arrival_key_over_max_key_bytes_is_key_too_long(store: StateStore) -> None:
    err = await refused(store, {"event": {"key": "é" * 513},
                                "condition_config": {"id": new_id(), "expect": 2}})
    assert err.code == "KEY_TOO_LONG"
    assert err.details == {"path": "$.event", "pointer": "/key", "size": 1026, "limit": 1024}
    assert "the arrival key at `/key` is 1026 bytes" in err.message


async def test_a_carried_value_over_max_value_bytes_is_value_too_large(
        store: StateStore) -> None:
    big = "x" * store.settings.max_value_bytes
    err = await refused(store, {"event": {"key": "a", "v": big},
                                "condition_config": {"id": new_id(), "expect": 2,
                                                     "carry": "/v"}})
    assert err.code == "VALUE_TOO_LARGE" and err.details["path"] == "$.event/v"
    err = await refused(store, {"event": {"key": "a", "v": big},
                                "condition_config": {"id": new_id(), "expect": 2}})
    assert err.code == "VALUE_TOO_LARGE" and err.details["path"] == "$.event"


async def test_the_payload_is_capped_and_a_refused_arrival_writes_nothing(
        store: StateStore) -> None:
    bid = new_id()
    config = {"id": bid, "expect": 3, "carry": "/v"}
    part = "x" * 800_000
    await arrive(store, {"key": "a", "v": part}, config)
    await arrive(store, {"key": "b", "v": part}, config)
    err = await refused(store, {"event": {"key": "c", "v": part}, "condition_config": config})
    size = 13 + 3 * (len('"a":""') + 800_000 + 1)
    assert err.code == "VALUE_TOO_LARGE"
    assert err.details == {"path": "$.event", "size": size, "limit": MAX_PAYLOAD_BYTES}
    assert err.message == (
        f"barrier `{bid}`: its payload would be {size} bytes of JSON with this arrival, more "
        f"than the limit of {MAX_PAYLOAD_BYTES} bytes for a barrier's payload "
        "(barrier.MAX_PAYLOAD_BYTES); nothing was written")
    # A replaced value counts by its new size; the refused arrival was not counted.
    err = await refused(store, {"event": {"key": "a", "v": part + "x" * 600_000},
                                "condition_config": config})
    assert err.code == "VALUE_TOO_LARGE"
    assert await arrive(store, {"key": "a", "v": "small"}, config) == skip(
        "`a` already counted, still 2/3")
    done = await arrive(store, {"key": "c", "v": part}, config)
    assert done["payload"]["results"] == {"a": "small", "b": part, "c": part}


async def test_a_named_set_is_counted_against_the_cap_as_the_barrier_keeps_it(
        store: StateStore) -> None:
    """The named keys stay in the barrier until they arrive (twice, as links): 4 x (key bytes
    + 1) each counts against the cap before anything is written, a call's or a trigger's."""
    per_key = 4 * (1000 + 1)
    fits = MAX_PAYLOAD_BYTES // per_key
    keys = [f"{i:04d}" + "k" * 996 for i in range(fits + 1)]
    bid = new_id()
    err = await refused(store, {"event": {"key": keys[0]},
                                "condition_config": {"id": bid, "expect": keys}})
    size = per_key * (fits + 1)
    assert err.code == "BARRIER_CONFIG"
    assert err.details == {"path": "$.condition_config.expect", "size": size,
                           "limit": MAX_PAYLOAD_BYTES}
    assert "condition_config.expect" in err.message and f"{size} bytes" in err.message
    assert f"limit of {MAX_PAYLOAD_BYTES} bytes" in err.message
    name = store.state.keys.barrier_partition(bid).barrier(bid)
    assert await store.state.conn.execute("EXISTS", name) == 0
    with pytest.raises(StateError) as caught:
        parse_condition(Settings(), msgspec.json.encode({"id": "b", "expect": keys}),
                        "$.options.condition_config")
    assert caught.value.details["path"] == "$.options.condition_config.expect"
    assert await arrive(store, {"key": keys[0]}, {"id": bid, "expect": keys[:fits]}) == skip(
        f"barrier `{bid}`: 1/{fits} arrived, waiting on {fits - 1} more: "
        + ", ".join(f"`{k}`" for k in keys[1:11]) + ", …")


# ---- what a barrier leaves ---------------------------------------------------------------------
async def test_a_barrier_writes_no_change_event_and_no_scope(store: StateStore) -> None:
    bid = new_id()
    for key in ("a", "b", "a", "c"):
        await arrive(store, {"key": key}, {"id": bid, "expect": ["a", "b", "c"]})
    for part in store.state.keys.all_partitions():
        assert await store.state.conn.execute("XLEN", part.events) == 0
    assert await store.list_groups() == []
    assert await store.state.conn.execute(
        "EXISTS", store.state.keys.barrier_partition(bid).barrier(bid)) == 1


async def test_the_typed_method_converts_tagged_values(store: StateStore) -> None:
    bid = new_id()
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    outcome = await store.barrier({"key": "a", "at": when, "total": decimal.Decimal("1.50")},
                                  {"id": bid, "expect": 1})
    assert outcome.decision == "allow"
    assert outcome.payload == {"results": {"a": {"key": "a", "at": when,
                                                 "total": decimal.Decimal("1.50")}}}


# ---- concurrency, in one process ---------------------------------------------------------------
@pytest.mark.parametrize("named", [False, True])
async def test_concurrent_arrivals_at_a_new_barrier_allow_exactly_once(
        store: StateStore, named: bool) -> None:
    bid, keys = new_id(), [f"k{i}" for i in range(60)]
    config = {"id": bid, "expect": keys if named else len(keys), "carry": "/i"}
    replies: list[dict[str, Any]] = []

    async def one(i: int) -> None:
        replies.append(await arrive(store, {"key": keys[i], "i": i}, config))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for i in range(len(keys)):
                tg.start_soon(one, i)
    allowed = [r for r in replies if r["decision"] == "allow"]
    assert len(allowed) == 1
    assert allowed[0]["payload"]["results"] == {k: i for i, k in enumerate(keys)}
    counts = sorted(int(r["reason"].split(": ")[1].split("/")[0])
                    for r in replies if r["decision"] == "skip")
    assert counts == list(range(1, len(keys)))  # each arrival counted once, in turn


# ---- expiry and deletion -------------------------------------------------------------------------
async def test_a_completed_barrier_expires_as_configured_and_an_open_one_does_not(
        redis_server: RedisServer, prefix: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               barrier_ttl_s=3) as store:
        done, open_, conn = new_id(), new_id(), store.state.conn
        before = now_ms()
        await arrive(store, {"key": "a"}, {"id": done, "expect": 1})
        await arrive(store, {"key": "a"}, {"id": open_, "expect": 2})
        name = store.state.keys.barrier_partition(done).barrier(done)
        expires = int(await conn.execute("HGET", name, "z"))
        assert before + 3000 <= expires <= now_ms() + 3000
        assert await conn.execute("PEXPIRETIME", name) == expires
        assert await conn.execute("PTTL", store.state.keys.barrier_partition(open_).barrier(
            open_)) == -1
        # Gone once the time is up; an arrival then starts a new barrier of that id.
        await until(lambda: _gone(conn, name), 10, "the barrier's expiry")
        assert (await arrive(store, {"key": "b"}, {"id": done, "expect": 2}))["reason"] == \
            f"barrier `{done}`: 1/2 arrived, waiting on 1 more"


async def _gone(conn: Any, name: str) -> bool:
    return not await conn.execute("EXISTS", name)


async def test_delete_barrier_removes_an_open_or_complete_one_and_says_whether(
        store: StateStore) -> None:
    complete, open_ = new_id(), new_id()
    await arrive(store, {"key": "a"}, {"id": complete, "expect": 1})
    await arrive(store, {"key": "a"}, {"id": open_, "expect": ["a", "b"]})
    for bid in (complete, open_):
        assert await store.call("state::delete-barrier", {"id": bid}) == {"deleted": True}
        assert await store.call("state::delete-barrier", {"id": bid}) == {"deleted": False}
        name = store.state.keys.barrier_partition(bid).barrier(bid)
        assert await store.state.conn.execute("EXISTS", name) == 0
    # A new round of a deleted id starts over (the named set's links went with it).
    assert (await arrive(store, {"key": "b"}, {"id": open_, "expect": ["a", "b"]}))[
        "reason"] == f"barrier `{open_}`: 1/2 arrived, waiting on 1 more: `a`"
    assert await store.delete_barrier("never-made") is False


async def test_delete_barrier_refuses_a_bad_id_with_its_field_and_limit(
        store: StateStore) -> None:
    assert "`id`" in (await _refusal(store, {})).message  # (missing: the request's own path, $)
    for body, code, path in (({"id": ""}, "INVALID_REQUEST", "$.id"),
                             ({"id": 7}, "INVALID_REQUEST", "$.id"),
                             ({"id": "x" * 1025}, "KEY_TOO_LONG", "$.id"),
                             ({"id": "a", "extra": 1}, "UNKNOWN_FIELD", "$.extra")):
        with pytest.raises(StateError) as caught:
            await store.call("state::delete-barrier", body)
        assert (caught.value.code, caught.value.details.get("path")) == (code, path), body
    assert "1024" in str((await _refusal(store, {"id": "x" * 1025})).message)


async def _refusal(store: StateStore, body: Any) -> StateError:
    with pytest.raises(StateError) as caught:
        await store.call("state::delete-barrier", body)
    return caught.value


async def test_a_barrier_made_again_after_a_deletion_is_numbered_above_the_old(
        store: StateStore) -> None:
    """The snapshot keeps the newest state by `w`: a barrier deleted (or expired) and made
    again must not start over below what PostgreSQL may still hold of the old one."""
    bid = new_id()
    name = store.state.keys.barrier_partition(bid).barrier(bid)
    for key in ("a", "b", "c"):
        await arrive(store, {"key": key}, {"id": bid, "expect": 5})
    old = int(await store.state.conn.execute("HGET", name, "w"))
    await store.delete_barrier(bid)
    await arrive(store, {"key": "a"}, {"id": bid, "expect": 5})
    assert int(await store.state.conn.execute("HGET", name, "w")) > old
