"""The bus protocol's call entry and reply document, written and read by bus/protocol.py and
bus/entries.py only: the bytes are the contract of docs/bus-protocol.md (and the README's "The
bus protocol (any language)"), which programs in other languages write and read, so they are
compared byte for byte here."""

from __future__ import annotations

import hashlib

import hiredis
import msgspec

from stateworker.bus.entries import call_digest, parse_entry
from stateworker.bus.protocol import BusOptions, call_entry, parse_reply, reply_document
from stateworker.errors import NotFound
from stateworker.keys import BusKeys, KeySpace, bus_stream, reply_prefix


def resp(*args: bytes | str | int) -> bytes:
    return bytes(hiredis.pack_command(args))


def test_a_call_entry_is_the_readme_form_byte_for_byte() -> None:
    # As the client sends it: every optional field, in the README's order.
    entry = call_entry("sw:bus:state", "c-1", "state::get", b'{"scope":"s","key":"k"}',
                       "sw:reply:r1", 1_700_000_000_000, "billing", {"execution_id": "e-1"})
    assert resp(*entry) == resp(
        "XADD", "sw:bus:state", "*", "id", "c-1", "fn", "state::get",
        "body", b'{"scope":"s","key":"k"}', "reply", "sw:reply:r1",
        "deadline_ms", 1_700_000_000_000, "caller", "billing",
        "context", b'{"execution_id":"e-1"}')
    # As the dispatcher sends a handler call: no reply list, no deadline, caller `state`.
    handler = call_entry("sw:bus:reactor", "t1:p0:1-0", "reactor::on", b"{}", "", caller="state")
    assert resp(*handler) == resp("XADD", "sw:bus:reactor", "*", "id", "t1:p0:1-0",
                                  "fn", "reactor::on", "body", b"{}", "reply", "",
                                  "caller", "state")
    # No caller and no context: the fields are left out, not sent empty.
    bare = call_entry("sw:bus:state", "c-2", "state::get", "{}", "sw:reply:r1", 5, None, {})
    assert bare == ["XADD", "sw:bus:state", "*", "id", "c-2", "fn", "state::get", "body", "{}",
                    "reply", "sw:reply:r1", "deadline_ms", 5]


def test_what_call_entry_writes_parse_entry_reads() -> None:
    entry = call_entry("sw:bus:state", "c-1", "state::get", b'{"a":1}', "sw:reply:r1", 42,
                       "billing", {"execution_id": "e-1"})
    flat = [a if isinstance(a, bytes) else str(a).encode() for a in entry[3:]]
    call, reply, call_id, error, msgpack = parse_entry(("s", b"1-0"), flat, BusOptions())
    assert error is None and call is not None and not msgpack and not call.msgpack
    assert (call.id, call.fn, call.body, call.reply, call.deadline_ms) == (
        "c-1", "state::get", b'{"a":1}', b"sw:reply:r1", 42)
    assert (call.ctx.caller, call.ctx.context) == ("billing", {"execution_id": "e-1"})
    assert (reply, call_id) == (b"sw:reply:r1", "c-1")


def test_what_reply_document_writes_parse_reply_reads() -> None:
    ok = reply_document("c-1", b'{"n":1.50}', None)
    assert ok == b'{"id":"c-1","ok":true,"result":{"n":1.50}}'
    read = parse_reply(ok)
    assert read is not None and read.ok and read.id == "c-1"
    assert bytes(read.result) == b'{"n":1.50}'  # the result's JSON as written: 1.50 stays
    failed = reply_document("c-2", None, NotFound("no such key", {"key": "k"}))
    assert msgspec.json.decode(failed) == {"id": "c-2", "ok": False, "error": {
        "code": "NOT_FOUND", "message": "no such key", "details": {"key": "k"}}}
    read = parse_reply(failed)
    assert read is not None and not read.ok and read.error["code"] == "NOT_FOUND"
    assert parse_reply(b"not a reply") is None


def test_every_bus_name_comes_from_keys() -> None:
    assert bus_stream("sw", "orders") == "sw:bus:orders" == BusKeys("sw", "orders").stream
    assert KeySpace("sw", 4).bus_stream("orders") == "sw:bus:orders"
    assert reply_prefix("sw") == "sw:reply:" == BusKeys("sw", "orders").reply_prefix


def test_a_call_digest_is_of_the_function_and_the_canonical_body() -> None:
    """docs/bus-protocol.md, "The identity of a call": SHA-1 of fn, NUL, canonical body."""
    canonical = b'{"a":[1.50,"\xc3\xa9"],"b":2}'
    expected = hashlib.sha1(b"orders::create\0" + canonical).hexdigest()
    for body in [canonical, b'{ "b": 2, "a": [1.50, "\\u00e9"] }', b'{"b":1,"a":[1.50,"\xc3\xa9"],"b":2}']:
        assert call_digest("orders::create", body) == expected, body
    assert call_digest("orders::create", b'{"a":[1.5,"\xc3\xa9"],"b":2}') != expected
    assert call_digest("orders::cancel", canonical) != expected
    not_json = b"{not json"
    assert call_digest("f", not_json) == hashlib.sha1(b"f\0" + not_json).hexdigest()


def test_a_published_reply_is_asked_by_the_last_field_and_never_for_a_principal() -> None:
    entry = call_entry("sw:bus:state", "c-1", "state::get", b"{}", "sw:reply:r1", 42,
                       publish=True)
    assert entry[-2:] == ["publish", "1"]
    flat = [a if isinstance(a, bytes) else str(a).encode() for a in entry[3:]]
    in_script = frozenset({"state::get"})
    call, *_ = parse_entry(("s", b"1-0"), flat, BusOptions(), None, "state", in_script)
    assert call is not None and call.ctx.answer is not None and call.ctx.answer.publish
    # A principal's call is answered on its own reply lists only (acl mode): its reply is
    # never published on a channel others could listen to.
    call, *_ = parse_entry(("s", b"1-0"), flat, BusOptions(), "alice", "state", in_script)
    assert call is not None and call.ctx.answer is not None and not call.ctx.answer.publish
    # Without the field: a reply list's reply, as ever.
    call, *_ = parse_entry(("s", b"1-0"), flat[:-2], BusOptions(), None, "state", in_script)
    assert call is not None and call.ctx.answer is not None and not call.ctx.answer.publish
