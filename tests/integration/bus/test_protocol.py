"""Every function over the raw bus protocol: XADD with the documented fields, BLPOP the reply;
and what a hostile or careless caller gets: reply keys the service does not own refused, a
call id bound to its first call across partitions, an oversized context refused."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import logs
from stateworker.app.service import StateService
from stateworker.clock import now_ms
from stateworker.error_codes import doc_url
from stateworker.keys import KeySpace, call_field
from stateworker.scripts.bindings import DIGEST_BYTES
from tests.integration.busproto import receive, roundtrip, send, until
from tests.records import record_of

pytestmark = pytest.mark.anyio


async def ok(raw: aredis.Redis, prefix: str, fn: str, body: Any, **extra: Any) -> Any:
    document = await roundtrip(raw, prefix, fn, body, **extra)
    assert document["ok"] is True, document
    return document["result"]


async def fails(raw: aredis.Redis, prefix: str, fn: str, body: Any, **extra: Any
                ) -> dict[str, Any]:
    document = await roundtrip(raw, prefix, fn, body, **extra)
    assert document["ok"] is False, document
    error: dict[str, Any] = document["error"]
    assert set(error) == {"code", "message", "details"}
    return error


async def test_every_function_over_the_bus(service: StateService, raw: aredis.Redis,
                                           prefix: str, scope: str) -> None:
    s = {"scope": scope}
    k = {**s, "key": "k"}
    assert await ok(raw, prefix, "state::get", k) is None
    created = await ok(raw, prefix, "state::set", {**k, "value": {"n": 1}, "topic": "t"})
    assert created["created"] is True and created["version"] == 1
    assert await ok(raw, prefix, "state::get", k) == {"n": 1}
    assert await ok(raw, prefix, "state::update", {**k, "ops": [
        {"type": "increment", "path": "n", "by": 2}]}) == {
        "old_value": {"n": 1}, "new_value": {"n": 3}, "version": 2}
    assert await ok(raw, prefix, "state::compare-and-set", {**k, "expected": {"n": 3},
                                                             "value": {"n": 4}}) == {"swapped": True}
    assert await ok(raw, prefix, "state::compare-and-set", {**k, "expected": 0, "value": 1}) == {
        "swapped": False, "current": {"n": 4}}
    entry = await ok(raw, prefix, "state::get-entry", k, caller="w1")
    assert entry["found"] is True and entry["version"] == 3 and entry["topic"] == "t"
    assert await ok(raw, prefix, "state::list", s) == [{"n": 4}]
    assert await ok(raw, prefix, "state::list_keys", s) == {"keys": ["k"]}
    assert scope in (await ok(raw, prefix, "state::list_groups", {}))["groups"]
    assert scope in (await ok(raw, prefix, "state::list-namespaces", {}))["namespaces"]
    page = await ok(raw, prefix, "state::list-entries", {**s, "include_values": True})
    assert [e["value"] for e in page["entries"]] == [{"n": 4}]
    assert (await ok(raw, prefix, "state::diff", {**k, "value": {"n": 4}}))["changed"] is False
    assert await ok(raw, prefix, "state::update-topic", {**k, "topic": "u"}) == {"updated": True}
    assert await ok(raw, prefix, "state::delete-by-topic", {**s, "topic_pattern": "u"}) == {
        "deleted": 1}
    await ok(raw, prefix, "state::set", {**k, "value": [], "expected_version": 0})
    assert await ok(raw, prefix, "state::delete", k) == []


async def test_writer_comes_from_caller_and_context(service: StateService, raw: aredis.Redis,
                                                    prefix: str, scope: str) -> None:
    k = {"scope": scope, "key": "k"}
    await ok(raw, prefix, "state::set", {**k, "value": 1}, caller="orders",
             context=msgspec.json.encode({"execution_id": "ex-9", "user_id": "u"}))
    entry = await ok(raw, prefix, "state::get-entry", k)
    assert entry["updated_by"] == "ex-9"


async def test_documented_errors_over_the_bus(service: StateService, raw: aredis.Redis,
                                              prefix: str, scope: str) -> None:
    k = {"scope": scope, "key": "k"}
    assert (await fails(raw, prefix, "state::nope", {}))["code"] == "UNKNOWN_FUNCTION"
    error = await fails(raw, prefix, "state::set", {"scope": scope, "key": 5, "value": 1})
    assert error["code"] == "INVALID_REQUEST" and error["details"]["path"] == "$.key"
    assert (await fails(raw, prefix, "state::get", {"scope": "state_barrier", "key": "k"}))[
        "code"] == "RESERVED_SCOPE"
    await ok(raw, prefix, "state::set", {**k, "value": 1})
    conflict = await fails(raw, prefix, "state::set", {**k, "value": 2, "create_only": True})
    assert conflict["code"] == "CONFLICT"
    assert conflict["details"] == {"expected_version": 0, "current_version": 1}
    missing = await fails(raw, prefix, "state::get-entry", {**k, "key": "x", "required": True})
    assert missing["code"] == "NOT_FOUND"
    late = await fails(raw, prefix, "state::set", {**k, "value": 3},
                       deadline_ms=str(now_ms() - 1000))
    assert late["code"] == "DEADLINE_EXCEEDED"
    assert await ok(raw, prefix, "state::get", k) == 1  # nothing written by the late call
    big = await fails(raw, prefix, "state::set", {**k, "value": "x" * (1024 * 1024 + 1)})
    assert big["code"] == "VALUE_TOO_LARGE" and big["details"]["limit"] == 1024 * 1024


async def test_retry_with_the_same_id_applies_once(service: StateService, raw: aredis.Redis,
                                                   prefix: str, scope: str) -> None:
    body = {"scope": scope, "key": "n", "ops": [{"type": "increment", "path": "c", "by": 1}]}
    replies = []
    for _ in range(3):
        _call_id, reply = await send(raw, prefix, "state::update", body, call_id="retry-1",
                                    reply=f"{prefix}:reply:retry")
        replies.append(await raw.blpop([reply], timeout=10))
    documents = [popped[1] for popped in replies if popped is not None]
    assert len(documents) == 3 and len(set(documents)) == 1
    assert msgspec.json.decode(documents[0])["result"]["new_value"] == {"c": 1}
    assert await ok(raw, prefix, "state::get", {"scope": scope, "key": "n"}) == {"c": 1}
    # a mutation that failed in its script is answered the same way again too
    for _ in range(2):
        await ok(raw, prefix, "state::set", {"scope": scope, "key": "once", "value": 1},
                 call_id="cs-1")
    entry = await ok(raw, prefix, "state::get-entry", {"scope": scope, "key": "once"})
    assert entry["version"] == 1


async def stats(raw: aredis.Redis, prefix: str) -> dict[str, int]:
    counters = await raw.hgetall(f"{prefix}:stats:state")
    return {k.decode(): int(v) for k, v in counters.items() if k != b"flushed_ms"}


async def counters_reach(raw: aredis.Redis, prefix: str, name: str, value: int
                         ) -> dict[str, int]:
    """The stats hash once counter `name` reached `value` (counters are written to Redis a
    little after the calls, with the replies or by the flusher)."""
    try:
        with anyio.fail_after(10):
            while (counters := await stats(raw, prefix)).get(name, 0) < value:
                await anyio.sleep(0.02)  # polling the stats hash
    except TimeoutError:
        raise AssertionError(f"counter {name} did not reach {value}: "
                             f"{await stats(raw, prefix)}") from None
    return counters


async def drained(raw: aredis.Redis, prefix: str) -> None:
    """Wait until every entry of the stream is acknowledged and deleted."""
    stream = f"{prefix}:bus:state"
    with anyio.fail_after(10):
        while (await raw.xpending(stream, "state"))["pending"] or await raw.xlen(stream):
            await anyio.sleep(0.01)  # polling: acknowledgements follow the replies


async def test_fire_and_forget_and_refused_reply_keys(service: StateService, raw: aredis.Redis,
                                                      prefix: str, scope: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "stateworker")
    began = time.monotonic()
    stream = f"{prefix}:bus:state"
    await raw.xadd(stream, {"id": "ff-1", "fn": "state::set", "reply": "",
                            "body": msgspec.json.encode({"scope": scope, "key": "f",
                                                         "value": 1})})
    # Replies go only to `<prefix>:reply:<something>`. A call naming any other key is not run,
    # is acknowledged and counted, and nothing is written to that key (no reply, no expiry).
    outside_string, outside_list = f"other-{uuid.uuid4().hex}", f"other-{uuid.uuid4().hex}"
    await raw.set(outside_string, "mine")
    await raw.rpush(outside_list, "a", "b")
    keyspace = KeySpace(prefix, 4)  # another partition's event stream than the scope's
    events = keyspace.partition((keyspace.partition_of(scope) + 1) % 4).events
    await raw.xadd(events, {"keep": "me"})
    refused = [outside_string, outside_list, events, f"{prefix}:replyx", f"{prefix}:reply:",
               f"{prefix}:stats:state", f"other:{prefix}:reply:x"]
    for n, key in enumerate(refused):
        await raw.xadd(stream, {"id": f"bad-reply-{n}", "fn": "state::set", "reply": key,
                                "body": msgspec.json.encode({"scope": scope, "key": f"bad-{n}",
                                                             "value": n})})
    assert await ok(raw, prefix, "state::get", {"scope": scope, "key": "f"}) == 1
    await drained(raw, prefix)
    assert await ok(raw, prefix, "state::list_keys", {"scope": scope}) == {"keys": ["f"]}
    assert await raw.get(outside_string) == b"mine" and await raw.pttl(outside_string) == -1
    assert await raw.lrange(outside_list, 0, -1) == [b"a", b"b"]
    assert await raw.pttl(outside_list) == -1
    assert [fields for _, fields in await raw.xrange(events)] == [{b"keep": b"me"}]
    assert await raw.pttl(events) == -1
    assert not await raw.exists(f"{prefix}:replyx", f"{prefix}:reply:", f"other:{prefix}:reply:x")
    counters = await counters_reach(raw, prefix, "reply_refused", len(refused))
    assert counters["reply_refused"] == len(refused)
    # Said once a window, not once a call (a caller naming keys not its own floods no log).
    said = [r for r in caplog.records if getattr(r, "event", "") == "call.reply_refused"]
    assert len(said) <= 1 + int((time.monotonic() - began) // logs.REPEAT_S), said
    await raw.delete(outside_string, outside_list)


async def test_a_reply_name_holding_another_type(service: StateService, raw: aredis.Redis,
                                                 prefix: str, scope: str) -> None:
    """A key under the reply prefix that is no list (a caller's SET): Redis refuses the reply
    (WRONGTYPE). The call runs once and is acknowledged (a script's reply: the key left as it
    is; the service's own, an error: counted as refused); no INTERNAL error, and a retry of
    the call to a proper list gets its recorded reply."""
    taken = f"{prefix}:reply:{uuid.uuid4().hex}"
    await raw.set(taken, "mine")
    body = {"scope": scope, "key": "typed", "value": 1}
    await send(raw, prefix, "state::set", body, reply=taken, call_id="typed-1")
    await drained(raw, prefix)
    assert await raw.get(taken) == b"mine" and await raw.pttl(taken) == -1
    await send(raw, prefix, "state::set", {"scope": scope}, reply=taken, call_id="typed-2")
    await drained(raw, prefix)
    again = await roundtrip(raw, prefix, "state::set", body, call_id="typed-1")
    assert again["result"]["version"] == 1 and again["result"]["created"] is True
    counters = await counters_reach(raw, prefix, "reply_refused", 1)
    assert counters["reply_refused"] == 1 and "errors:INTERNAL" not in counters
    await raw.delete(taken)


async def test_status_counters_and_acknowledged_stream(service: StateService, raw: aredis.Redis,
                                                       prefix: str, scope: str) -> None:
    for i in range(5):
        await ok(raw, prefix, "state::set", {"scope": scope, "key": f"k{i}", "value": i})
    await fails(raw, prefix, "state::nope", {})
    await fails(raw, prefix, "state::set", {"scope": scope})
    _call_id, reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "k1"})
    assert (await receive(raw, reply))["result"] == 1
    await drained(raw, prefix)
    counters = await counters_reach(raw, prefix, "calls", 8)
    assert counters["calls"] == 8
    assert {k: v for k, v in counters.items() if k.startswith("errors:")} == {
        "errors:UNKNOWN_FUNCTION": 1, "errors:INVALID_REQUEST": 1}
    buckets = {k: v for k, v in counters.items() if k.startswith(("latency_le_", "latency_gt_"))}
    assert sum(buckets.values()) == 8  # one latency per call
    assert counters["latency_us_sum"] > 0


async def test_reply_lists_expire(service: StateService, raw: aredis.Redis, prefix: str,
                                  scope: str) -> None:
    _call_id, reply = await send(raw, prefix, "state::get", {"scope": scope, "key": "k"})
    assert await raw.blmove(reply, reply, 10, "LEFT", "LEFT") is not None  # the reply is there
    assert 0 < await raw.pttl(reply) <= 300_000  # README: reply lists expire after 5 minutes


async def test_reads_check_the_deadline(service: StateService, raw: aredis.Redis, prefix: str,
                                        scope: str) -> None:
    await ok(raw, prefix, "state::set", {"scope": scope, "key": "k", "value": 1})
    s, k = {"scope": scope}, {"scope": scope, "key": "k"}
    reads = [("state::get", k), ("state::get-entry", k), ("state::list", s),
             ("state::list_keys", s), ("state::list_groups", {}), ("state::list-entries", s),
             ("state::list-namespaces", {}), ("state::diff", {**k, "value": 1, "update": False})]
    for fn, body in reads:
        for deadline in (now_ms() - 1000, now_ms() - 1):
            late = await fails(raw, prefix, fn, body, deadline_ms=str(deadline))
            assert late["code"] == "DEADLINE_EXCEEDED", (fn, late)
        assert (await roundtrip(raw, prefix, fn, body, deadline_ms=str(now_ms() + 60_000)))[
            "ok"] is True, fn  # in time: answered


async def test_every_reserved_scope_is_refused_by_every_function(
    service: StateService, raw: aredis.Redis, prefix: str
) -> None:
    for reserved in ("state_barrier", "state_triggers", "state_namespaces"):
        s, k = {"scope": reserved}, {"scope": reserved, "key": "k"}
        calls = [("state::get", k), ("state::set", {**k, "value": 1}), ("state::delete", k),
                 ("state::list", s), ("state::list_keys", s),
                 ("state::compare-and-set", {**k, "value": 1}), ("state::get-entry", k),
                 ("state::update", {**k, "ops": [{"type": "set", "path": "a", "value": 1}]}),
                 ("state::list-entries", s), ("state::diff", {**k, "value": 1}),
                 ("state::update-topic", {**k, "topic": "t"}),
                 ("state::delete-by-topic", {**s, "topic_pattern": "*"})]
        for fn, body in calls:
            error = await fails(raw, prefix, fn, body)
            assert error["code"] == "RESERVED_SCOPE", (reserved, fn, error)
            assert error["details"]["scope"] == reserved
    groups = await ok(raw, prefix, "state::list_groups", {})
    assert not {"state_barrier", "state_triggers", "state_namespaces"} & set(groups["groups"])


async def test_a_late_retry_of_an_applied_call_gets_its_reply(
    service: StateService, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    body = {"scope": scope, "key": "k", "value": 1}
    deadline = str(now_ms() + 60_000)
    first = await roundtrip(raw, prefix, "state::set", body, call_id="late-1", deadline_ms=deadline)
    assert first["ok"] is True
    again = await roundtrip(raw, prefix, "state::set", body, call_id="late-1",
                            deadline_ms=str(now_ms() - 1))
    assert again == first  # recorded before the deadline: the same reply, not DEADLINE_EXCEEDED
    never = await roundtrip(raw, prefix, "state::set", {**body, "key": "x"}, call_id="late-2",
                            deadline_ms=str(now_ms() - 1))
    assert never["error"]["code"] == "DEADLINE_EXCEEDED"
    assert await ok(raw, prefix, "state::get", {"scope": scope, "key": "x"}) is None


async def test_a_call_id_reused_for_another_call_is_refused(
    service: StateService, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    k = {"scope": scope, "key": "k"}
    await ok(raw, prefix, "state::set", {**k, "value": 1}, call_id="reused-1")
    other_body = await fails(raw, prefix, "state::set", {**k, "value": 2}, call_id="reused-1")
    other_fn = await fails(raw, prefix, "state::delete", k, call_id="reused-1")
    assert other_body["code"] == other_fn["code"] == "CALL_ID_REUSED"
    assert "reused-1" in other_body["message"]
    assert await ok(raw, prefix, "state::get", k) == 1  # neither ran


async def test_oversized_entry_fields_are_refused(service: StateService, raw: aredis.Redis,
                                                 prefix: str, scope: str) -> None:
    long_id = await fails(raw, prefix, "state::get", {"scope": scope, "key": "k"},
                          call_id="i" * 257)
    assert long_id["code"] == "INVALID_REQUEST" and long_id["details"]["limit"] == 256
    long_writer = await fails(raw, prefix, "state::set", {"scope": scope, "key": "k", "value": 1},
                              context=msgspec.json.encode({"execution_id": "e" * 300}))
    assert long_writer["details"]["path"] == "context.execution_id"


async def test_a_retry_answered_from_a_record_of_an_older_version(
    service: StateService, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    # Records written by an older version name op errors by index with the whole message (no
    # trailing marker); a retry after an upgrade still gets that reply back as it was.
    body = {"scope": scope, "key": "k", "ops": [
        {"type": "set", "path": "__proto__", "value": 1},
        {"type": "increment", "path": "name", "by": 1}]}
    await ok(raw, prefix, "state::set", {"scope": scope, "key": "k", "value": {"name": "x"}})
    first = await ok(raw, prefix, "state::update", body, call_id="old-format")
    assert [e["op_index"] for e in first["errors"]] == [0, 1]
    found = await record_of(raw, service.state.keys, "old-format")
    assert found is not None
    key, record = found
    reply = msgspec.msgpack.decode(record[DIGEST_BYTES:])
    assert reply[7] == 1  # this version's marker
    reply = [*reply[:6], [1, "increment.not_number", "an older version's message"]]
    await raw.hset(key, call_field("old-format"),  # type: ignore[misc]
                   record[:DIGEST_BYTES] + msgspec.msgpack.encode(reply))
    again = await ok(raw, prefix, "state::update", body, call_id="old-format")
    assert again["errors"] == [
        first["errors"][0],
        {"op_index": 1, "code": "increment.not_number", "message": "an older version's message",
         "doc_url": doc_url("increment.not_number")}]
    assert again["new_value"] == first["new_value"] == {"name": "x"}


# ---- what a hostile or careless caller gets --------------------------------------------------
async def acknowledged(raw: aredis.Redis, prefix: str, entry_id: bytes) -> bool:
    """The state service has read and acknowledged this entry of its stream."""
    stream = f"{prefix}:bus:state"
    groups = await raw.xinfo_groups(stream)
    if not groups or groups[0]["last-delivered-id"] < entry_id:
        return False
    return not await raw.xpending_range(stream, "state", min=entry_id, max=entry_id, count=1)


async def test_replies_go_only_to_reply_lists_of_the_prefix(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    foreign_string, foreign_list = f"app:{uuid.uuid4().hex}", f"app:{uuid.uuid4().hex}"
    own_key = f"{prefix}:stats:state"  # under the prefix, but not a reply list
    await raw.set(foreign_string, "mine")
    await raw.rpush(foreign_list, "a")
    stream = f"{prefix}:bus:state"
    entries = []
    for n, reply in enumerate((foreign_string, foreign_list, own_key, f"{prefix}:reply:")):
        body = msgspec.json.encode({"scope": scope, "key": f"k{n}", "value": n})
        entries.append(await raw.xadd(stream, {"id": f"bad-{n}", "fn": "state::set",
                                               "body": body, "reply": reply}))
    await until(lambda: acknowledged(raw, prefix, entries[-1]), 10, "the entries acknowledged")
    assert await raw.get(foreign_string) == b"mine" and await raw.ttl(foreign_string) == -1
    assert await raw.lrange(foreign_list, 0, -1) == [b"a"] and await raw.ttl(foreign_list) == -1
    assert await raw.type(own_key) in (b"hash", b"none")
    for n in range(4):  # none of the calls ran
        document = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": f"k{n}"})
        assert document["result"] is None

    async def counted() -> bool:
        return await raw.hget(f"{prefix}:stats:state", "reply_refused") == b"4"

    await until(counted, 10, "reply_refused counted")


def two_scopes_in_two_partitions(prefix: str) -> tuple[str, str]:
    keys = KeySpace(prefix, 4)
    first = "acct-a"
    second = next(f"acct-{n}" for n in range(100)
                  if keys.partition_of(f"acct-{n}") != keys.partition_of(first))
    return first, second


async def test_a_call_id_is_bound_to_its_first_call_across_partitions(
        service: StateService, raw: aredis.Redis, prefix: str) -> None:
    a, b = two_scopes_in_two_partitions(prefix)
    increment = [{"type": "increment", "path": "", "by": 1}]
    first = await roundtrip(raw, prefix, "state::update", {"scope": a, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert first["ok"] is True
    other = await roundtrip(raw, prefix, "state::update", {"scope": b, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert other["ok"] is False and other["error"]["code"] == "CALL_ID_REUSED"
    assert "pay-1" in other["error"]["message"]
    read = await roundtrip(raw, prefix, "state::get", {"scope": b, "key": "bal"},
                           call_id="pay-1")
    assert read["error"]["code"] == "CALL_ID_REUSED"
    again = await roundtrip(raw, prefix, "state::update", {"scope": a, "key": "bal",
                                                           "ops": increment}, call_id="pay-1")
    assert again == first  # the first call's retry: its recorded reply
    assert (await roundtrip(raw, prefix, "state::get", {"scope": a, "key": "bal"}))["result"] == 1
    assert (await roundtrip(raw, prefix, "state::get", {"scope": b, "key": "bal"}))["result"] \
        is None
    # A read's retry with the same id is the same call.
    body = {"scope": a, "key": "bal"}
    assert (await roundtrip(raw, prefix, "state::get", body, call_id="r-1"))["result"] == 1
    assert (await roundtrip(raw, prefix, "state::get", body, call_id="r-1"))["result"] == 1


async def test_concurrent_reuse_of_one_id_in_many_partitions_applies_once(
        service: StateService, raw: aredis.Redis, prefix: str) -> None:
    scopes = [f"race-{n}" for n in range(16)]
    sent = [await send(raw, prefix, "state::set", {"scope": s, "key": "k", "value": 1},
                       call_id="same-id") for s in scopes]
    documents = [await receive(raw, reply) for _, reply in sent]
    assert sum(d["ok"] for d in documents) == 1
    assert {d["error"]["code"] for d in documents if not d["ok"]} == {"CALL_ID_REUSED"}
    written = [(await roundtrip(raw, prefix, "state::get", {"scope": s, "key": "k"}))["result"]
               for s in scopes]
    assert written.count(1) == 1 and written.count(None) == 15


async def test_context_is_bounded(service: StateService, raw: aredis.Redis, prefix: str,
                                  scope: str) -> None:
    body = {"scope": scope, "key": "k", "value": 1}
    big = msgspec.json.encode({"user_id": "u", "note": "x" * (64 * 1024)})
    document = await roundtrip(raw, prefix, "state::set", body, context=big)
    error = document["error"]
    assert error["code"] == "VALUE_TOO_LARGE"
    assert error["details"] == {"path": "context", "size": len(big), "limit": 64 * 1024}
    assert "65536" in error["message"]
    assert (await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": "k"}))[
        "result"] is None
    fits = msgspec.json.encode({"user_id": "u", "note": "x" * 60_000})
    assert (await roundtrip(raw, prefix, "state::set", body, context=fits))["ok"] is True
