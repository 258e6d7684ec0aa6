"""The bus under faults: kill -9 with calls in flight, SIGTERM under load, hostile input."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Awaitable
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.bus.runtime import SKIM
from stateworker.keys import KeySpace
from tests.integration.busproto import roundtrip, until
from tests.records import reply_of
from tests.servers import RedisServer, ServiceProcess, tcp_quiet

pytestmark = pytest.mark.anyio


def increment(scope: str) -> bytes:
    return msgspec.json.encode({"scope": scope, "key": "counter",
                                "ops": [{"type": "increment", "path": "n", "by": 1}]})


async def xadd_many(raw: aredis.Redis, stream: str, entries: list[dict[str, Any]]) -> None:
    async with raw.pipeline(transaction=False) as pipe:
        for fields in entries:
            pipe.xadd(stream, fields)
        await pipe.execute()


async def collect(raw: aredis.Redis, reply: str, want: set[str], timeout: float
                  ) -> dict[str, list[bytes]]:
    """Replies on `reply` by call id, until every id in `want` has one; after `timeout` the
    test fails, naming how many are missing."""
    got: dict[str, list[bytes]] = {}
    try:
        with anyio.fail_after(timeout):
            while not want <= got.keys():
                popped = await raw.blpop([reply], timeout=1)
                if popped is not None:
                    document = popped[1]
                    got.setdefault(msgspec.json.decode(document)["id"], []).append(document)
    except TimeoutError:
        missing = want - got.keys()
        raise AssertionError(f"{len(missing)} of {len(want)} calls unanswered after {timeout} s, "
                             f"e.g. {sorted(missing)[:5]}") from None
    return got


async def freeze_in_flight(service: ServiceProcess, raw: aredis.Redis, stream: str,
                           port: int, reply: str) -> list[bytes]:
    """The service, frozen (SIGSTOP) before its calls were added, let run in short spells
    until it is stopped at a moment when calls are answered on `reply` and others are in
    flight (read from the stream and not acknowledged), and Redis has run every command it
    sent: what Redis holds then is exactly what a kill would leave. Returns the entry ids in
    flight. (Short spells: let run freely, a loaded machine's service may answer every call
    before the first freeze.)"""
    with anyio.fail_after(30):
        while True:
            service.thaw()
            service.freeze()
            while not tcp_quiet(port):
                await anyio.sleep(0.002)  # polling the kernel's socket queues
            pending = await raw.xpending_range(stream, "state", "-", "+", 100_000)
            if pending and await raw.llen(reply):
                return [entry["message_id"] for entry in pending]


async def call_ids(raw: aredis.Redis, stream: str) -> dict[bytes, str]:
    """The entries still in the stream: entry id -> call id."""
    return {entry_id: fields[b"id"].decode() for entry_id, fields in await raw.xrange(stream)}


async def test_kill_9_with_calls_in_flight(redis_server: RedisServer, raw: aredis.Redis,
                                           prefix: str, scope: str) -> None:
    stream, reply = f"{prefix}:bus:state", f"{prefix}:reply:crash"
    ids = [f"call-{i}" for i in range(1000)]
    entries = [{"id": i, "fn": "state::update", "body": increment(scope), "reply": reply}
               for i in ids]
    first = ServiceProcess(redis_server.url, prefix, consumer="crash-1")
    first.start()
    try:
        first.freeze()  # (idle: the calls come while it is stopped)
        await xadd_many(raw, stream, entries + entries[:100])  # 100 client retries on top
        in_flight = await freeze_in_flight(first, raw, stream, redis_server.port, reply)
        first.kill()  # SIGKILL, with calls read, running and unread
    finally:
        first.kill()
    # What the kill left, counted exactly: each of the 1,100 entries is answered (and deleted
    # from the stream), in flight (pending) or unread.
    pending = [p["message_id"] for p in await raw.xpending_range(stream, "state", "-", "+", 2000)]
    assert pending == in_flight and len(in_flight) > 0, "the kill must find calls in flight"
    left = await call_ids(raw, stream)
    before = [msgspec.json.decode(d) for d in await raw.lrange(reply, 0, -1)]
    assert len(before) + len(left) == 1100
    assert set(in_flight) <= left.keys()
    # Applied calls are exactly those with a record, each applied once; every answer was applied.
    space = KeySpace(prefix, 4)
    recorded = {i for i in ids if await reply_of(raw, space, i) is not None}
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        applied_before = (await store.get(scope, "counter") or {}).get("n", 0)
    answered_before = {d["id"]: d["result"]["new_value"]["n"] for d in before}
    assert applied_before == len(recorded)
    assert answered_before.keys() <= recorded
    assert len(set(answered_before.values())) == len(answered_before)
    print(f"at the kill: {len(in_flight)} calls in flight, {len(before)} answered, "
          f"{len(recorded)} applied ({len(recorded - answered_before.keys())} not answered), "
          f"{len(left) - len(in_flight)} unread")

    await xadd_many(raw, stream, entries[500:700])  # retries while the service is down
    second = ServiceProcess(redis_server.url, prefix, consumer="crash-2",
                            visibility_timeout_ms=500)
    second.start()
    try:
        await until(lambda: _at_least(raw.llen(reply), 1300), 60, "1,300 replies")
        await until(lambda: _drained(raw, stream), 30, "the stream to be acknowledged")
    finally:
        second.kill()
    # Every entry got exactly one reply; every delivery of an id the same one; each id applied
    # once: the counter's values 1..1000 are handed out one per id.
    documents = await raw.lrange(reply, 0, -1)
    assert len(documents) == 1300
    by_id: dict[str, list[bytes]] = {}
    for document in documents:
        by_id.setdefault(msgspec.json.decode(document)["id"], []).append(document)
    assert by_id.keys() == set(ids)
    for n, call_id in enumerate(ids):
        assert len(by_id[call_id]) == 1 + (n < 100) + (500 <= n < 700), call_id
        assert len(set(by_id[call_id])) == 1, call_id
    values = sorted(msgspec.json.decode(d[0])["result"]["new_value"]["n"] for d in by_id.values())
    assert values == list(range(1, 1001))
    for call_id, n in answered_before.items():  # answered before the kill: the same again
        assert msgspec.json.decode(by_id[call_id][0])["result"]["new_value"]["n"] == n
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        assert await store.get(scope, "counter") == {"n": 1000}


async def _at_least(count: Awaitable[int], target: int) -> bool:
    return await count >= target


async def _drained(raw: aredis.Redis, stream: str) -> bool:
    """Every entry acknowledged and deleted."""
    return (await raw.xpending(stream, "state"))["pending"] == 0 and await raw.xlen(stream) == 0


async def test_sigterm_with_calls_in_flight_answers_every_call_read(
    redis_server: RedisServer, raw: aredis.Redis, prefix: str, scope: str
) -> None:
    stream, reply = f"{prefix}:bus:state", f"{prefix}:reply:term"
    ids = [f"t-{i}" for i in range(3000)]
    entries = [{"id": i, "fn": "state::set", "reply": reply,
                "body": msgspec.json.encode({"scope": scope, "key": i, "value": {"i": i}})}
               for i in ids]
    late, entries = entries[2000:], entries[:2000]
    service = ServiceProcess(redis_server.url, prefix, consumer="term-1")
    service.start()
    try:
        service.freeze()  # (idle: the calls come while it is stopped)
        await xadd_many(raw, stream, entries)
        frozen_at = await freeze_in_flight(service, raw, stream, redis_server.port, reply)
        in_stream = await call_ids(raw, stream)
        in_flight = {in_stream[entry_id] for entry_id in frozen_at}
        # Calls that come with the signal: a read under way may take one batch of them,
        # then it stops reading (those read before, even far ahead, are in flight).
        await xadd_many(raw, stream, late)
        service.signal(signal.SIGTERM)  # arrives with those calls in flight
        service.thaw()
        assert service.wait(timeout=30) == 0
    finally:
        service.kill()
    assert (await raw.xpending(stream, "state"))["pending"] == 0  # nothing left unacknowledged
    unread = set((await call_ids(raw, stream)).values())
    replies = await raw.lrange(reply, 0, -1)
    answered = [msgspec.json.decode(document)["id"] for document in replies]
    print(f"SIGTERM with {len(in_flight)} calls in flight: {len(answered)} answered, "
          f"{len(unread)} left unread")
    assert len(answered) == len(set(answered))  # each call answered once
    assert set(answered) | unread == set(ids) and not set(answered) & unread
    assert in_flight <= set(answered)  # in flight at the signal: answered before the exit
    assert len(unread) >= len(late) - SKIM, "after SIGTERM the service stops reading"
    assert all(msgspec.json.decode(document)["ok"] for document in replies)
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        # exactly the answered calls were applied, the unread ones not
        assert await store.list_keys(scope) == sorted(answered, key=str.encode)


JUNK_VALUES = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"", b"{", b"[]", b"1", b"null", b'"text"', b"{\"scope\": 1}", b"\xff\xfe",
                     b'{"scope":"s","key":"k","value":', b"{}", b'{"scope":"s"}']),
    st.text(max_size=20).map(str.encode),
)
FUNCTIONS = st.sampled_from(["state::get", "state::set", "state::update", "state::nope",
                             "state::list-entries", "state::delete", "", "state::diff"])


REPLY = b"<reply>"  # replaced by the example's reply list


@st.composite
def junk_entry(draw: st.DrawFn) -> dict[str, bytes]:
    fields: dict[str, bytes] = {}
    if draw(st.booleans()):
        fields["id"] = draw(st.one_of(st.uuids().map(lambda u: u.hex.encode()), JUNK_VALUES))
    if draw(st.booleans()):
        fields["fn"] = draw(st.one_of(FUNCTIONS.map(str.encode), JUNK_VALUES))
    if draw(st.integers(0, 3)):
        fields["body"] = draw(JUNK_VALUES)
    for name in draw(st.lists(st.sampled_from(["deadline_ms", "caller", "context", "extra"]),
                              max_size=3)):
        fields[name] = draw(JUNK_VALUES)
    if draw(st.integers(0, 4)):
        fields["reply"] = REPLY
    if not fields:
        fields["junk"] = b"1"
    return fields


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(drawn=st.lists(junk_entry(), min_size=50, max_size=50))
async def test_hostile_entries_get_error_replies_and_are_acknowledged(
    service: StateService, raw: aredis.Redis, prefix: str, drawn: list[dict[str, bytes]]
) -> None:
    stream = f"{prefix}:bus:state"
    scope = f"hostile-{uuid.uuid4().hex}"  # one per example: its counter starts at 0
    reply = f"{prefix}:reply:junk-{uuid.uuid4().hex}"
    batch = [{k: reply.encode() if v == REPLY and k == "reply" else v for k, v in fields.items()}
             for fields in drawn]
    good_reply = f"{prefix}:reply:good-{uuid.uuid4().hex}"
    good = [{"id": f"{good_reply}-{i}", "fn": "state::update", "body": increment(scope),
             "reply": good_reply} for i in range(5)]
    await xadd_many(raw, stream, [*batch[:25], *good, *batch[25:]])
    expected = sum(1 for fields in batch if fields.get("reply") == reply.encode())
    with anyio.fail_after(30):
        documents = [(await raw.blpop([reply], timeout=30))[1] for _ in range(expected)]
    for document in documents:
        parsed = msgspec.json.decode(document)
        assert isinstance(parsed["ok"], bool)
        if not parsed["ok"]:
            assert parsed["error"]["code"] and parsed["error"]["message"]
    goods = await collect(raw, good_reply, {g["id"] for g in good}, timeout=30)
    results = [msgspec.json.decode(d[0]) for d in goods.values()]
    assert all(r["ok"] for r in results), results
    assert sorted(r["result"]["new_value"]["n"] for r in results) == [1, 2, 3, 4, 5]
    await until(lambda: _drained(raw, stream), 30, "every entry acknowledged")
    # the good calls applied once each, and no entry was answered twice
    assert await raw.llen(reply) == 0 and await raw.llen(good_reply) == 0
    counter = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": "counter"})
    assert counter["result"] == {"n": 5}


async def test_a_20_mib_body_is_refused(service: StateService, raw: aredis.Redis,
                                        prefix: str) -> None:
    document = await roundtrip(raw, prefix, "state::set", b"{" + b" " * (20 * 1024 * 1024) + b"}")
    assert document["ok"] is False and document["error"]["code"] == "VALUE_TOO_LARGE"
    assert document["error"]["details"]["limit"] == 5 * 1024 * 1024
    ok = await roundtrip(raw, prefix, "state::list_groups", {})
    assert ok["ok"] is True


async def test_deeply_nested_fields_are_refused_not_fatal(service: StateService,
                                                          raw: aredis.Redis, prefix: str,
                                                          scope: str) -> None:
    deep = b"[" * 5000 + b"]" * 5000
    context = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": "k"},
                              context=deep)
    assert context["error"]["code"] == "INVALID_REQUEST"
    body = await roundtrip(raw, prefix, "state::set", b'{"scope":"s","key":"k","value":' + deep
                           + b"}")
    assert body["error"]["code"] == "INVALID_REQUEST"
    assert (await roundtrip(raw, prefix, "state::list_groups", {}))["ok"] is True
