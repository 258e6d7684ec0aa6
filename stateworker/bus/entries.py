"""A call entry as read (docs/bus-protocol.md, "A call"): its fields checked against their
limits, its digest (what its id is bound to), the Call. Whatever an entry holds, the answer is
a Call or the error to reply with: never an exception (`parse_entry`). The HTTP face reads
its calls' context and digest with the same functions.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec

from stateworker import codec
from stateworker.bus.formats import body_json, is_msgpack
from stateworker.bus.protocol import BusOptions, Call, Ref, reply_head
from stateworker.context import Answer, CallContext
from stateworker.errors import InvalidRequest, PermissionDenied, StateError, ValueTooLarge, shown
from stateworker.keys import MAX_FUNCTION_BYTES

# parse_entry's reply: the call or None, reply list, call id, error, whether msgpack
Parsed = tuple[Call | None, bytes, str | None, StateError | None, bool]



def own_call_id(principal: str | None, call_id: str) -> str:
    """`acl` mode: a call id is its principal's own, `<principal>/<id>`, for its records and
    binding, on every door (a bus entry's id, HTTP's Idempotency-Key): one principal's ids
    never meet another's, whatever text they hold."""
    return call_id if principal is None else f"{principal}/{call_id}"

def parse_entry(ref: Ref, flat: list[bytes], options: BusOptions, principal: str | None = None,
                group: str | None = None, in_script: frozenset[str] = frozenset()) -> Parsed:
    """A stream entry as a Call, or the error to answer with (and where, to which id, and
    whether in msgpack: `fmt msgpack`, bus/formats.py, its body turned into JSON here).

    `principal`: the principal whose stream (`acl` mode) the entry was read from. It is the
    call's caller; a `caller` field naming anyone else is refused (PERMISSION_DENIED), so no
    field of an entry can change who makes the call. `group`: the consumer group that read
    it; a call of a function in `in_script` (with a reply list) is answered by its own script
    (context.Answer)."""
    fields: dict[bytes, bytes] = dict(zip(flat[::2], flat[1::2], strict=False))
    reply = fields.get(b"reply", b"")
    call_id: str | None = None
    msgpack = False
    try:
        raw_id = fields.get(b"id")
        call_id = None if raw_id is None else raw_id.decode()
        fmt = fields.get(b"fmt")
        msgpack = fmt is not None and is_msgpack(fmt)  # (JSON, nearly always: no call)
        if raw_id is None or not call_id:
            raise InvalidRequest(f"id: the call has {'no' if raw_id is None else 'an empty'} "
                                 "`id` field (a unique id per logical call)", {"path": "id"})
        fn = _text(fields, b"fn")
        _limit("fn", fn.encode(), MAX_FUNCTION_BYTES)
        body = fields.get(b"body")
        if body is None:
            raise InvalidRequest("body: the call has no `body` field (a JSON object)",
                                 {"path": "body"})
        if len(body) > options.max_body_bytes:
            raise ValueTooLarge(
                f"body is {len(body)} bytes, more than the limit of {options.max_body_bytes} bytes",
                {"path": "body", "size": len(body), "limit": options.max_body_bytes})
        if msgpack:
            body = body_json(body)
        deadline = _deadline(fields.get(b"deadline_ms"))
        caller = fields.get(b"caller")
        context = parse_context(fields.get(b"context"), options.max_context_bytes)
        _limit("id", raw_id, MAX_ID_BYTES)
        _limit("reply", reply, MAX_REPLY_KEY_BYTES)
        _limit("caller", caller, MAX_ID_BYTES)
        digest = call_digest(fn, body)
        named = None if caller is None else _text(fields, b"caller")
        if principal is not None:
            named = principal_caller(principal, named)
        own_id = own_call_id(principal, call_id)
        answer = Answer(reply, ref[0], ref[1], group, options.reply_ttl_ms, reply_head(
            call_id), publish=principal is None and fields.get(b"publish") == b"1") \
            if group is not None and reply and fn in in_script and not msgpack else None
        ctx = CallContext(caller=named, context=context, call_id=own_id, deadline_ms=deadline,
                          call_digest=digest, principal=principal, answer=answer)
    except UnicodeDecodeError:
        return None, reply, None, InvalidRequest("id: not valid UTF-8 text", {"path": "id"}), False
    except StateError as exc:
        return None, reply, call_id, exc, msgpack
    except Exception as exc:  # whatever a caller sends, it is an error reply, never a crash
        return None, reply, call_id, InvalidRequest(
            f"the call entry cannot be read: {type(exc).__name__}", {"path": "entry"}), msgpack
    return (Call(ref, call_id, fn, body, reply, deadline, ctx, msgpack=msgpack), reply, call_id,
            None, msgpack)


def call_digest(fn: str, body: bytes) -> str:
    """What a call id is bound to (its record keeps it): SHA-1 hex of the function, NUL and
    the body's canonical form: as a value is stored (compact, escapes resolved, a duplicate
    key's last value, numbers as written) with object keys sorted, so a retry that serializes
    the same JSON again (other spacing, key order or escapes) is the same call. (Not
    codec.canonical's Go escaping: the same equality, at a quarter of the cost on this path.)
    A body that is no JSON (refused when it runs): its exact bytes."""
    try:
        text = _SORTED.encode(codec.decode_exact(body))
    except ValueError:
        text = body
    return hashlib.sha1(fn.encode() + b"\0" + text).hexdigest()


_SORTED = msgspec.json.Encoder(order="sorted")


def principal_caller(principal: str, named: str | None) -> str:
    """The caller of a principal's call (`acl` mode): the principal; a call naming anyone
    else is PERMISSION_DENIED (a bus entry's `caller`, the HTTP face's caller header)."""
    if named is not None and named != principal:
        raise PermissionDenied(
            f"caller: {shown(named)} is not the principal {shown(principal)} whose stream the call came "
            "from; in acl mode the caller is the authenticated principal (leave `caller` out)",
            {"path": "caller", "caller": named, "principal": principal})
    return principal


MAX_ID_BYTES = 256  # id, caller, context.execution_id (the writer recorded in every event)
MAX_REPLY_KEY_BYTES = 1024
MAX_DEADLINE_DIGITS = 18  # deadline_ms: a signed 64-bit integer holds any 18 digits


def _limit(field: str, value: bytes | None, limit: int) -> None:
    if value is not None and len(value) > limit:
        raise InvalidRequest(f"{field}: is {len(value)} bytes, more than the limit of {limit} "
                             "bytes", {"path": field, "size": len(value), "limit": limit})


def _text(fields: dict[bytes, bytes], name: bytes) -> str:
    raw = fields.get(name)
    if raw is None:
        raise InvalidRequest(f"{name.decode()}: the call has no `{name.decode()}` field",
                             {"path": name.decode()})
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"{name.decode()}: not valid UTF-8 text",
                             {"path": name.decode()}) from exc


_DEADLINE = re.compile(rb"-?[0-9]{1,%d}" % MAX_DEADLINE_DIGITS)


def _deadline(raw: bytes | None) -> int | None:
    if raw is None or raw == b"":
        return None
    if not _DEADLINE.fullmatch(raw):  # (not int(): it takes "1_000" and " 7 ")
        raise InvalidRequest(
            f"deadline_ms: must be an integer of at most {MAX_DEADLINE_DIGITS} digits (epoch "
            f"milliseconds), got {shown(raw[:40].decode(errors='replace'))}",
            {"path": "deadline_ms", "limit": MAX_DEADLINE_DIGITS})
    return int(raw)


def parse_context(raw: bytes | None, limit: int, field: str = "context") -> dict[str, Any]:
    """A call's `context` (a JSON object of at most `limit` bytes; none: {}), from the bus
    entry's field or the HTTP face's header; errors name `field`."""
    if raw is None or raw == b"":
        return {}
    if len(raw) > limit:  # checked before parsing: a huge context costs nothing
        raise ValueTooLarge(f"{field} is {len(raw)} bytes, more than the limit of {limit} bytes",
                            {"path": field, "size": len(raw), "limit": limit})
    try:
        codec.check_depth(raw)
    except codec.LimitExceeded as exc:
        raise InvalidRequest(f"{field}: {exc}", {"path": field, "limit": exc.limit}) from exc
    try:
        context = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidRequest(f"{field}: not valid JSON: {exc}", {"path": field}) from exc
    if not isinstance(context, dict):
        raise InvalidRequest(f"{field}: must be a JSON object", {"path": field})
    execution = context.get("execution_id")  # (the writer every event records: `updated_by`)
    if isinstance(execution, str):
        _limit(f"{field}.execution_id", execution.encode(), MAX_ID_BYTES)
    return context
