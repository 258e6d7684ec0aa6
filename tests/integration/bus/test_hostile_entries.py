"""Entries a broken or hostile caller XADDs by hand: whatever they hold, the service answers
each (or drops it, for a reply key it must not write), logs no crash, leaves nothing pending,
and goes on answering a normal call."""

from __future__ import annotations

import datetime
import json
import logging
import uuid
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker.app.service import StateService
from stateworker.engines.dagu.specs import SPECS as DAGU
from stateworker.engines.moco.specs import SPECS as MOCO
from stateworker.specs import NATIVE
from tests.integration.busproto import roundtrip, until

pytestmark = pytest.mark.anyio

GET = b'{"scope":"s","key":"k"}'


def decode(document: bytes) -> dict[str, Any]:
    if document[:1] == b"{":
        # json, not msgspec: a stored 1e309 comes back as written, beyond a double
        result: dict[str, Any] = json.loads(document)
        return result
    decoded: dict[str, Any] = msgspec.msgpack.decode(document)
    return decoded


def hostile(prefix: str) -> list[dict[str, Any]]:
    """Entries, each a normal call with one part broken (None: the field left out)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    odd_bodies: list[bytes] = [
        b"", b"\xff\xfe", b"null", b"1e309", b"-0", str(2**64).encode(), b"[]", b'"s"',
        b"{", b"{}", deep, b'{"scope":' * 5000 + b"1" + b"}" * 5000,
        b'{"scope":"s","key":"k","key":"k2"}', b'{"scope":1e309,"key":"k"}',
        b'{"scope":"s","key":"k","value":1e309}', b'{"scope":"s","key":"\\ud800"}',
        b'{"scope":"\x00","key":"k"}', b'{"scope":"s","key":' + b"9" * 5000 + b"}",
        b'{"scope":"s","key":"k","value":' + b"9" * 5000 + b"}",
        b'{"scope":"s","key":"k","expected_version":' + str(2**64).encode() + b"}",
        b'{"scope":"s","key":"k","expected_version":-1}',
        b'{"scope":"s","key":"k","expected_version":1e309}',
        b'{"scope":"s","key":"k","ttl_ms":' + str(2**64).encode() + b"}",
        b'{"scope":"s","key":"k","ttl_ms":-0}',
        b'{"scope":"s","key":"k","ttl_ms":1.5}',
    ]
    pack = msgspec.msgpack.encode
    packed_bodies: list[bytes] = [
        b"", b"\xc1", b"\x81", pack(None), pack(1), pack([1, 2]), pack({1: 2}),
        pack({"scope": b"bin", "key": "k"}),
        pack({"scope": "s", "key": "k", "value": float("nan")}),
        pack({"scope": "s", "key": "k", "value": 2**64 - 1}),
        pack({"scope": "s", "key": "k", "value": -(2**63)}),
        pack({"scope": "s", "key": "k", "value": msgspec.msgpack.Ext(5, b"x")}),
        pack({"scope": "s", "key": "k", "value": msgspec.msgpack.Ext(-1, b"\xff" * 12)}),
        pack({"scope": "s", "key": "k", "value": msgspec.msgpack.Ext(-1, b"\xff" * 3)}),
        pack({"scope": "s", "key": "k",
              "value": datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC)}),
        b"\x91" * 100_000 + b"\xc0", b"\x81\xa1a" * 5000 + b"\xc0",
        pack({"scope": "s", "key": "k"}) + b"trailing",
        b"\x82\xa5scope\xa1s\xa3key\xa2\xff\xfe",
    ]
    fns: list[Any] = [b"", b"\xff", "state::" + "x" * 300, "::", "state::get\x00", 1, b"\x00",
                      "state::get ", "STATE::GET", "state::"]
    values: list[Any] = [b"", b"\xff", b"\x00", b"x" * 70_000, "1e309", "-0", str(2**64),
                         str(-(2**64)), "nan", "0x10", "1.5", "-", "+5"]
    entries: list[dict[str, Any]] = []
    for body in odd_bodies:
        entries += [{"fn": "state::get", "body": body}, {"fn": "state::set", "body": body},
                    {"fn": "state::update", "body": body}, {"fn": "state::query", "body": body}]
    for body in packed_bodies:
        entries += [{"fn": "state::get", "body": body, "fmt": "msgpack"},
                    {"fn": "state::set", "body": body, "fmt": "msgpack"}]
    for fn in fns:
        entries.append({"fn": fn})
    for field in ("id", "fn", "body", "reply", "deadline_ms", "caller", "context", "publish",
                  "fmt"):
        entries += [{field: value} for value in values]
        entries.append({field: None})
    for deadline in ("0", "1", "-999999999999999999", "999999999999999999", "-0", "00001"):
        entries.append({"deadline_ms": deadline})
    for context in (b"null", b"{}", b'{"execution_id":1}', b'{"execution_id":null}',
                    b'{"traceparent":1}', b'{"traceparent":"00-zz-zz-01"}',
                    b'{"traceparent":"' + b"0" * 60_000 + b'"}', b'{"tracestate":[1]}',
                    b'{"traceparent":"00-' + b"0" * 32 + b"-" + b"0" * 16 + b'-01"}'):
        entries.append({"context": context})
    return entries


async def test_hostile_entries_are_all_answered_and_the_service_goes_on(
        service: StateService, raw: aredis.Redis, prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    stream = f"{prefix}:bus:state"
    waiting: dict[str, dict[str, Any]] = {}
    for n, broken in enumerate(hostile(prefix)):
        reply = f"{prefix}:reply:{uuid.uuid4().hex}"
        entry: dict[str, Any] = {"id": f"h-{n}", "fn": "state::get", "body": GET, "reply": reply,
                                 **broken}
        entry = {k: v for k, v in entry.items() if v is not None}
        await raw.xadd(stream, entry)
        if isinstance(entry.get("reply"), str) and entry["reply"] == reply:
            waiting[reply] = entry
    answers: dict[str, list[dict[str, Any]]] = {}

    async def all_answered() -> bool:
        for reply in waiting:
            got = await raw.lrange(reply, 0, -1)
            answers[reply] = [decode(d) for d in got]
        return all(answers[r] for r in waiting)

    await until(all_answered, 60, "a reply to every hostile entry")
    bad = []
    for reply, entry in waiting.items():
        for answer in answers[reply]:
            if not answer.get("ok") and answer["error"]["code"] == "INTERNAL":
                bad.append((entry, answer))
    assert not bad, bad[:5]

    async def nothing_pending() -> bool:
        return int((await raw.xpending(stream, "state"))["pending"]) == 0

    await until(nothing_pending, 30, "no entry left pending")
    crashes = [(r.getMessage(), getattr(r, "event", ""), r.exc_text)
               for r in caplog.records if r.levelno >= logging.ERROR]
    assert not crashes, crashes[:5]
    document = await roundtrip(raw, prefix, "state::set",
                               {"scope": "after", "key": "k", "value": 1})
    assert document["ok"], document


async def test_reply_keys_of_other_types_are_left_as_they_were(
        service: StateService, raw: aredis.Redis, prefix: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A `reply` naming a hash, a stream, a string under the prefix, the service's own stream
    or its counters: each call is acknowledged, and none of those keys is changed."""
    caplog.set_level(logging.ERROR)
    stream = f"{prefix}:bus:state"
    await raw.hset(f"{prefix}:reply:a-hash", "a", "1")
    await raw.xadd(f"{prefix}:reply:a-stream", {"a": "1"})
    await raw.set(f"{prefix}:reply:a-string", "x")
    keys = [f"{prefix}:reply:a-hash", f"{prefix}:reply:a-stream", f"{prefix}:reply:a-string",
            stream, f"{prefix}:stats:state"]
    before = {key: await raw.dump(key) for key in keys[:3]}
    for key in keys:
        for fn, body, fmt in (("state::get", GET, "json"),
                              ("state::set", b'{"scope":"s","key":"k","value":1}', "json"),
                              ("state::set", b"nope", "json"),
                              ("state::get", msgspec.msgpack.encode({"scope": "s", "key": "k"}),
                               "msgpack"),
                              ("nope::x", b"{}", "json")):
            await raw.xadd(stream, {"id": uuid.uuid4().hex, "fn": fn, "body": body,
                                    "reply": key, "fmt": fmt})

    async def drained() -> bool:
        pending = int((await raw.xpending(stream, "state"))["pending"])
        return pending == 0 and (await raw.xinfo_groups(stream))[0]["lag"] == 0

    await until(drained, 30, "every entry acknowledged")
    assert {key: await raw.dump(key) for key in keys[:3]} == before
    assert not [r.getMessage() for r in caplog.records], caplog.records
    document = await roundtrip(raw, prefix, "state::get", {"scope": "s", "key": "k"})
    assert document["ok"], document



@pytest.mark.parametrize("isolation", [b"1e309", b"-1e999", b"[1e309]", b"{\"a\":1e309}"])
async def test_an_isolation_no_json_value_holds_is_refused_naming_it(
        service: StateService, raw: aredis.Redis, prefix: str,
        caplog: pytest.LogCaptureFixture, isolation: bytes) -> None:
    """`isolation: 1e309` is JSON no double holds: refused naming `$.isolation`, not a crash
    (`call.crashed`, INTERNAL)."""
    caplog.set_level(logging.ERROR)
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    await raw.xadd(f"{prefix}:bus:state", {
        "id": uuid.uuid4().hex, "fn": "state::get", "reply": reply,
        "body": b'{"key":"k","isolation":' + isolation + b"}"})
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None
    error = decode(popped[1])["error"]
    assert (error["code"], error["details"]["path"]) == ("INVALID_REQUEST", "$.isolation"), error
    assert error["message"].startswith("$.isolation: must be one of workflow"), error
    assert not [r.getMessage() for r in caplog.records], caplog.records

_ODD: list[Any] = [
    "fz", "k", "", "k" * 300, "a.b", "\u0000", 0, -1, 1.5, 2**64, -(2**63) - 1, True, None,
    [], {}, ["k"], {"a": 1}, [{"key": "k", "value": 1}], [{"scope": "fz", "key": "k"}],
    [{"type": "set", "path": "a", "value": 1}], [{"type": "increment", "path": "a", "by": 1}],
    {"EQ": {"a": 1}}, [{"field": "a", "op": "eq", "value": 1}], "*", "fz*", "a::b",
    {"type": "all"}, [[1]], "workflow", "global", [{"pointer": "/a", "op": "eq", "value": 1}],
    [{"op": "delete", "scope": "fz", "key": "k", "expected_version": 2**64}], 9007199254740993,
    10**30, 1e308, "%_?", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "state::set"]
_ISOLATED = b'{"org_id":"o","workflow_id":"w","execution_id":"e"}'
_RAW_NUMBERS = [b"1e309", b"-0", b"18446744073709551616", b"-1e-400", b"9" * 400]


@st.composite
def native_call(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    """A native function and a body of its own fields (and a stranger now and then), each
    holding a value of the wrong type, size or range, or a number JSON allows and a double
    does not hold."""
    spec = draw(st.sampled_from((*NATIVE, *DAGU, *MOCO)))
    names = draw(st.lists(st.sampled_from(sorted(spec.fields | {"scope", "key", "nope"})),
                          max_size=6, unique=True))
    parts = []
    for name in names:
        raw_number = draw(st.one_of(st.none(), st.sampled_from(_RAW_NUMBERS)))
        value = raw_number if raw_number is not None and draw(st.booleans()) else (
            msgspec.json.encode(draw(st.sampled_from(_ODD))))
        parts.append(msgspec.json.encode(name) + b":" + value)
    context = draw(st.sampled_from([b"{}", _ISOLATED, b'{"user_id":"u","dag_name":"d"}',
                                    b'{"org_id":"o","workflow_id":1e309,"user_id":-0}']))
    return spec.name, b"{" + b",".join(parts) + b"}", context


@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(calls=st.lists(native_call(), min_size=60, max_size=60))
async def test_every_native_function_refuses_odd_fields_with_a_stable_code(
        service: StateService, raw: aredis.Redis, prefix: str,
        caplog: pytest.LogCaptureFixture, calls: list[tuple[str, bytes, bytes]]) -> None:
    caplog.set_level(logging.ERROR)
    caplog.clear()
    stream = f"{prefix}:bus:state"
    reply = f"{prefix}:reply:{uuid.uuid4().hex}"
    sent = {}
    for fn, body, context in calls:
        call_id = uuid.uuid4().hex
        sent[call_id] = (fn, body, context)
        await raw.xadd(stream, {"id": call_id, "fn": fn, "body": body, "reply": reply,
                                "context": context})
    got: dict[str, dict[str, Any]] = {}

    async def answered() -> bool:
        for document in await raw.lpop(reply, 100) or []:
            answer = decode(document)
            got[answer["id"]] = answer
        return len(got) == len(sent)

    await until(answered, 60, "a reply to every call")
    internal = [(sent[i], a) for i, a in got.items()
                if not a["ok"] and a["error"]["code"] == "INTERNAL"]
    assert not internal, internal[:3]
    assert not [(r.getMessage(), r.exc_text) for r in caplog.records], caplog.records[:3]
    document = await roundtrip(raw, prefix, "state::get", {"scope": "fz", "key": "k"})
    assert document["ok"], document
