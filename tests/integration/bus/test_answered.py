"""`state::set`, `state::get`, `state::delete` and `state::update` answered by their own
script (context.Answer: on one Redis the script LPUSHes the reply and acknowledges and deletes
the call's entry, no second round trip): the reply is byte for byte what the service would
encode, a retry gets the same bytes from the record (rendered by the service), an id reused is
refused, nothing is left pending or counted wrong."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import reply_document
from stateworker.schemas import SetResult, UpdateResult, encoder
from stateworker.state.kv.packed import pack, unpack
from tests.integration.busproto import send, until

pytestmark = pytest.mark.anyio

# Ids a JSON encoder must escape: the reply's head is written by the service, the rest by Lua.
ODD_IDS = ['q"uote', "back\\slash", "caf\u00e9 \u2603", "tab\there", "ctl\u0001"]


async def answer_bytes(raw: aredis.Redis, prefix: str, fn: str, body: Any,
                       **extra: Any) -> tuple[str, bytes]:
    """(call id, the reply document exactly as the service pushed it)."""
    call_id, reply = await send(raw, prefix, fn, body, **extra)
    popped = await raw.blpop([reply], timeout=10)
    assert popped is not None, f"no reply to {fn} within 10 s"
    return call_id, popped[1]


def as_service_encodes(call_id: str, document: bytes) -> bytes:
    """The reply document the service itself would write for this set's result."""
    result = msgspec.json.decode(document, type=dict[str, Any])["result"]
    typed = msgspec.json.decode(msgspec.json.encode(result), type=SetResult)
    return reply_document(call_id, encoder.encode(typed), None)


async def test_a_set_answered_by_its_script_is_what_the_service_would_write(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    values = [{"n": 1}, {"name": "caf\u00e9 \u2603", "nested": {"a": [1, 2.5, None, True]}},
              "text with \"quotes\" and \\", 12345678901234567890, None, [], {"n": 1}]
    for i, value in enumerate(values):
        body = {"scope": scope, "key": "k", "value": value}
        if i == 2:
            body |= {"topic": "t", "ttl_ms": 60_000}
        call_id, document = await answer_bytes(raw, prefix, "state::set", body,
                                               call_id=f"{ODD_IDS[i % len(ODD_IDS)]}-{i}")
        assert document == as_service_encodes(call_id, document)
        parsed = msgspec.json.decode(document)
        assert parsed["id"] == call_id and parsed["ok"] is True
        assert parsed["result"]["new_value"] == value
        assert parsed["result"]["version"] == i + 1
        assert parsed["result"]["created"] is (i == 0)
        assert parsed["result"]["old_value"] == (None if i == 0 else values[i - 1])


async def test_a_retried_set_gets_the_same_bytes_from_its_record(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    body = {"scope": scope, "key": "k", "value": {"v": "\u00e9"}}
    call_id, first = await answer_bytes(raw, prefix, "state::set", body, call_id='r"1')
    _, again = await answer_bytes(raw, prefix, "state::set", body, call_id=call_id)
    assert again == first  # answered by the service from the record, not run again
    _, other = await answer_bytes(raw, prefix, "state::set", {**body, "value": 2},
                                  call_id=call_id)
    assert msgspec.json.decode(other)["error"]["code"] == "CALL_ID_REUSED"
    _, read = await answer_bytes(raw, prefix, "state::get", {"scope": scope, "key": "k"})
    assert msgspec.json.decode(read)["result"] == {"v": "\u00e9"}


async def test_an_answered_set_leaves_nothing_pending_and_is_counted(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    stream = f"{prefix}:bus:state"
    replies = []
    for i in range(20):
        _, reply = await send(raw, prefix, "state::set",
                              {"scope": scope, "key": f"k{i}", "value": i})
        replies.append(reply)
    # fire and forget: no reply list, still acknowledged and deleted
    quiet = f"q-{uuid.uuid4().hex}"
    await raw.xadd(stream, {"id": quiet, "fn": "state::set", "body": msgspec.json.encode(
        {"scope": scope, "key": "quiet", "value": 1})})
    for reply in replies:
        assert (await raw.blpop([reply], timeout=10)) is not None
    _, kept = await send(raw, prefix, "state::set", {"scope": scope, "key": "kept", "value": 1})
    await until(lambda: raw.exists(kept), 10, "the last reply")
    assert 0 < await raw.pttl(kept) <= service.runtime.options.reply_ttl_ms

    async def drained() -> bool:
        return await raw.xlen(stream) == 0 and (await raw.xpending(stream, "state"))[
            "pending"] == 0
    await until(drained, 10, "every entry acknowledged and deleted")
    _, got = await answer_bytes(raw, prefix, "state::get", {"scope": scope, "key": "quiet"})
    assert msgspec.json.decode(got)["result"] == 1
    # sets, the quiet one, kept, the get (a script's reply may arrive before the service has
    # read the script's own reply and counted the call)
    await until(lambda: service.runtime.stats.total == 20 + 1 + 1 + 1, 10, "23 calls counted")
    assert service.runtime.stats.total == 23


async def test_a_get_answered_by_its_script(service: StateService, raw: aredis.Redis,
                                            prefix: str, scope: str) -> None:
    key = {"scope": scope, "key": "k"}
    call_id, missing = await answer_bytes(raw, prefix, "state::get", key, call_id='g"1')
    assert missing == reply_document(call_id, b"null", None)
    stored = '{"b":[1,2.50,"\u00e9"],"a":null}'  # kept as written: no re-encoding on the way
    await answer_bytes(raw, prefix, "state::set", f'{{"scope":"{scope}","key":"k","value":'
                       f'{stored}}}')
    call_id, found = await answer_bytes(raw, prefix, "state::get", key, call_id="g2")
    assert found == reply_document(call_id, stored.encode(), None)
    _, again = await answer_bytes(raw, prefix, "state::get", key, call_id="g2")
    assert again == found  # the same call again: read again (reads are not recorded)
    _, reused = await answer_bytes(raw, prefix, "state::get", {**key, "key": "x"},
                                   call_id="g2")
    assert msgspec.json.decode(reused)["error"]["code"] == "CALL_ID_REUSED"
    # an entry whose expiry has passed (the reaper not yet by) reads as null
    entry = service.state.keys.for_scope(scope).entry(scope, "k")
    await raw.set(entry, pack(msgspec.structs.replace(unpack(await raw.get(entry)), expires=1)))
    call_id, expired = await answer_bytes(raw, prefix, "state::get", key)
    assert expired == reply_document(call_id, b"null", None)


async def test_a_delete_answered_by_its_script(service: StateService, raw: aredis.Redis,
                                               prefix: str, scope: str) -> None:
    stored = '{"z":1,"a":[1.50]}'
    await answer_bytes(raw, prefix, "state::set", f'{{"scope":"{scope}","key":"k","value":'
                       f'{stored}}}')
    key = {"scope": scope, "key": "k"}
    _, conflict = await answer_bytes(raw, prefix, "state::delete", {**key, "expected_version": 2})
    assert msgspec.json.decode(conflict)["error"]["code"] == "CONFLICT"  # (the service's)
    call_id, deleted = await answer_bytes(raw, prefix, "state::delete", key, call_id='d"1')
    assert deleted == reply_document(call_id, stored.encode(), None)
    _, again = await answer_bytes(raw, prefix, "state::delete", key, call_id=call_id)
    assert again == deleted  # from the record: nothing deleted twice
    call_id, missing = await answer_bytes(raw, prefix, "state::delete", key)
    assert missing == reply_document(call_id, b"null", None)
    _, read = await answer_bytes(raw, prefix, "state::get", key)
    assert msgspec.json.decode(read)["result"] is None


async def test_an_update_answered_by_its_script(service: StateService, raw: aredis.Redis,
                                                prefix: str, scope: str) -> None:
    key = {"scope": scope, "key": "k"}
    ops = [{"type": "increment", "path": "n", "by": 2},
           {"type": "set", "path": "s", "value": "caf\u00e9 \"q\""}]
    call_id, created = await answer_bytes(raw, prefix, "state::update", {**key, "ops": ops},
                                          call_id='u"1')
    typed = msgspec.json.decode(msgspec.json.encode(msgspec.json.decode(created)["result"]),
                                type=UpdateResult)
    assert created == reply_document(call_id, encoder.encode(typed), None)
    assert msgspec.json.decode(created)["result"] == {
        "old_value": None, "new_value": {"n": 2, "s": "caf\u00e9 \"q\""}, "version": 1}
    _, again = await answer_bytes(raw, prefix, "state::update", {**key, "ops": ops},
                                  call_id=call_id)
    assert again == created  # from the record, not applied twice
    call_id, updated = await answer_bytes(raw, prefix, "state::update", {**key, "ops": ops})
    assert msgspec.json.decode(updated)["result"] == {
        "old_value": {"n": 2, "s": "caf\u00e9 \"q\""},
        "new_value": {"n": 4, "s": "caf\u00e9 \"q\""}, "version": 2}
    # an op that fails (the others applied): the service writes the reply with its errors
    _, partly = await answer_bytes(raw, prefix, "state::update", {**key, "ops": [
        {"type": "increment", "path": "s", "by": 1}, {"type": "increment", "path": "n", "by": 1}]})
    result = msgspec.json.decode(partly)["result"]
    assert result["new_value"]["n"] == 5 and [e["code"] for e in result["errors"]] == [
        "increment.not_number"]


async def test_an_update_with_ops_refused_before_the_script_is_answered_with_them(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str) -> None:
    """An op the service refuses itself (a `__proto__` path) never reaches the script, which
    could not name it: such a call is answered by the service, with the op's error, and its
    retry gets the same bytes."""
    body = {"scope": scope, "key": "k", "ops": [{"type": "set", "path": "__proto__", "value": 1},
                                                {"type": "set", "path": "a", "value": 2}]}
    call_id, first = await answer_bytes(raw, prefix, "state::update", body)
    result = msgspec.json.decode(first)["result"]
    assert result["new_value"] == {"a": 2}
    assert [(e["op_index"], e["code"]) for e in result["errors"]] == [
        (0, "set.path.proto_polluted")]
    _, again = await answer_bytes(raw, prefix, "state::update", body, call_id=call_id)
    assert again == first


async def test_a_reply_key_of_another_type_loses_only_the_reply(
        service: StateService, raw: aredis.Redis, prefix: str, scope: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A caller whose reply key holds a string: its set applies once, the entry is
    acknowledged and deleted, and only the reply is lost (as when the service answers: its
    LPUSH fails the same way); a retry to a list gets the recorded reply, nothing applies
    twice; the calls behind it are answered."""
    stream = f"{prefix}:bus:state"
    broken = f"{prefix}:reply:broken-{uuid.uuid4().hex}"
    await raw.set(broken, "not a list")
    body = {"scope": scope, "key": "k", "value": 1}
    call_id, _ = await send(raw, prefix, "state::set", body, reply=broken)
    _, after = await answer_bytes(raw, prefix, "state::set",
                                  {"scope": scope, "key": "other", "value": 2})
    assert msgspec.json.decode(after)["ok"] is True

    async def drained() -> bool:
        return await raw.xlen(stream) == 0 and (await raw.xpending(stream, "state"))[
            "pending"] == 0
    await until(drained, 10, "every entry acknowledged and deleted")
    assert await raw.get(broken) == b"not a list"
    _, retried = await answer_bytes(raw, prefix, "state::set", body, call_id=call_id)
    assert msgspec.json.decode(retried)["result"]["version"] == 1  # applied once
    _, got = await answer_bytes(raw, prefix, "state::get-entry", {"scope": scope, "key": "k"})
    assert msgspec.json.decode(got)["result"]["version"] == 1
    # The caller's own key cost it its reply; it is no failure of the service's.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
