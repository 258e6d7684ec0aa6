"""The bus under faults: kill -9 with calls in flight, SIGTERM under load, hostile input."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.app.service import StateService
from tests.integration.busproto import roundtrip
from tests.servers import RedisServer, ServiceProcess

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
    """Replies on `reply` by call id, until every id in `want` has one (or the timeout)."""
    got: dict[str, list[bytes]] = {}
    with anyio.move_on_after(timeout):
        while not want <= got.keys():
            popped = await raw.blpop([reply], timeout=1)
            if popped is not None:
                document = popped[1]
                got.setdefault(msgspec.json.decode(document)["id"], []).append(document)
    return got


async def wait_for_replies(raw: aredis.Redis, reply: str, count: int) -> None:
    with anyio.fail_after(30):
        while await raw.llen(reply) < count:
            await anyio.sleep(0.005)  # polling the reply list for the first answers


async def test_kill_9_with_1000_calls_in_flight(redis_server: RedisServer, raw: aredis.Redis,
                                                prefix: str, scope: str) -> None:
    stream, reply = f"{prefix}:bus:state", f"{prefix}:reply:crash"
    ids = [f"call-{i}" for i in range(1000)]
    entries = [{"id": i, "fn": "state::update", "body": increment(scope), "reply": reply}
               for i in ids]
    first = ServiceProcess(redis_server.url, prefix, consumer="crash-1")
    first.start()
    try:
        await xadd_many(raw, stream, entries + entries[:100])  # 100 client retries on top
        await wait_for_replies(raw, reply, 1)
        first.kill()  # SIGKILL, with calls read, running and unread
    finally:
        first.kill()
    answered_before = await raw.llen(reply)
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4, reaper=False) as store:
        applied_before = (await store.get(scope, "counter") or {}).get("n", 0)
    # calls applied but not answered at the kill are redelivered and must not apply again
    print("answered before the kill:", answered_before, "applied:", applied_before)
    assert applied_before >= answered_before
    await xadd_many(raw, stream, entries[500:700])  # retries while the service is down
    second = ServiceProcess(redis_server.url, prefix, consumer="crash-2",
                            visibility_timeout_ms=500)
    second.start()
    try:
        got = await collect(raw, reply, set(ids), timeout=60)
        assert set(ids) <= got.keys(), f"unanswered: {len(set(ids) - got.keys())}"
        assert all(len(set(documents)) == 1 for documents in got.values())  # same reply
        counter = await roundtrip(raw, prefix, "state::get", {"scope": scope, "key": "counter"})
        assert counter["result"] == {"n": 1000}
        assert answered_before < 1300  # the kill did land with calls still in flight
        with anyio.fail_after(30):
            while (await raw.xpending(stream, "state"))["pending"]:
                await anyio.sleep(0.01)  # polling: the last acknowledgements are in flight
    finally:
        second.kill()


async def test_sigterm_answers_every_call_read(redis_server: RedisServer, raw: aredis.Redis,
                                               prefix: str, scope: str) -> None:
    stream, reply = f"{prefix}:bus:state", f"{prefix}:reply:term"
    ids = [f"t-{i}" for i in range(3000)]
    entries = [{"id": i, "fn": "state::set", "reply": reply,
                "body": msgspec.json.encode({"scope": scope, "key": i, "value": {"i": i}})}
               for i in ids]
    service = ServiceProcess(redis_server.url, prefix, consumer="term-1")
    service.start()
    try:
        await xadd_many(raw, stream, entries)
        await wait_for_replies(raw, reply, 1)
        service.signal(signal.SIGTERM)
        assert service.wait(timeout=30) == 0
    finally:
        service.kill()
    assert (await raw.xpending(stream, "state"))["pending"] == 0  # nothing left unacknowledged
    unread = {fields[b"id"].decode() for _, fields in await raw.xrange(stream)}
    replies = await raw.lrange(reply, 0, -1)
    answered = [msgspec.json.decode(document)["id"] for document in replies]
    assert len(answered) == len(set(answered))
    assert set(answered) | unread == set(ids) and not set(answered) & unread
    assert len(answered) > 0
    assert all(msgspec.json.decode(document)["ok"] for document in replies)


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
    service: StateService, raw: aredis.Redis, prefix: str, scope: str,
    drawn: list[dict[str, bytes]]
) -> None:
    stream = f"{prefix}:bus:state"
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
    assert all(msgspec.json.decode(d[0])["ok"] for d in goods.values())
    with anyio.fail_after(30):
        while (await raw.xpending(stream, "state"))["pending"] or await raw.xlen(stream):
            await anyio.sleep(0.01)  # polling: acknowledgements follow the replies


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
