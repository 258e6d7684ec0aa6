"""state::barrier: a fan-in gate, one atomic script per arrival (lua/barrier.lua).

An arrival is an event plus a condition config `{id, expect, key_from?, carry?}`. Python
resolves the arrival's key (the value at JSON pointer `key_from`, default `/key`: a string as
is, any other value as its compact JSON text) and the value it carries (at `carry`, default
the whole event; a missing target carries null), checks their sizes and hands both to the
script. The script keeps the barrier in one hash (keys.PartitionKeys.barrier) and answers
`skip` until every expected key has arrived, then `allow` with
`{"results": {key: carried, ...}}` (keys in byte order of their UTF-8) to the arrival that
completes it: exactly once, whatever the concurrency, since Redis runs one script at a time.

Arrival tokens make a repeated evaluation safe: the token of the completing arrival, given
again, gets the same `allow` and payload (a trigger dispatcher re-evaluating an event after a
crash uses `<trigger id>:<revision>`; a bus call uses its call id). A barrier is not an entry:
it writes no change event. It is never re-armed: a new round uses a new id.

A completed barrier is kept `barrier_ttl_s` (STATEWORKER_BARRIER_TTL_S), then its hash
expires with its payload (an arrival after that starts a new barrier of the id);
state::delete-barrier deletes one at once (lua/delbarrier.lua), complete or not.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import msgspec
from jsonpointer import JsonPointer, JsonPointerException

from stateworker import codec
from stateworker.context import NO_CONTEXT
from stateworker.errors import BarrierConfig, InternalError, InvalidRequest, KeyTooLong
from stateworker.keys import PartitionKeys
from stateworker.schemas import BarrierConfigShape, BarrierDecision, BarrierDeletedResult
from stateworker.scripts.bindings import BARRIER, DELBARRIER, barrier_call, delbarrier_call
from stateworker.scripts.replies import BarrierReply
from stateworker.scripts.statuses import Target
from stateworker.settings import Settings
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan

MAX_EXPECT = 10_000  # arrivals a barrier waits for, at most (a count, or named keys)
# A barrier's payload, at most: it travels in replies and in a trigger handler's call
# body next to the event (two values of up to max_value_bytes), under the bus's 5 MiB.
MAX_PAYLOAD_BYTES = 2 * 1024 * 1024
# A named set's keys are kept in the barrier until they arrive, each twice as a link field
# naming a neighbour (lua/barrier.lua: p<key>/x<key> = "=" .. key): 4 x (its bytes + 1), at
# most, per key. They count against the same cap, checked before the first write.
LINK_BYTES_PER_KEY = 4
EXPECT_TEXT_CHARS = 200  # of a named set's key list, in messages
DEFAULT_KEY_FROM = "/key"  # a state event's own key


class BarrierCondition(msgspec.Struct, frozen=True, kw_only=True):
    """A checked `condition_config` (from `parse_condition`). `expect`: a count, or the named
    keys in byte order. The last four fields are derived from the others on construction."""

    id: str
    expect: int | tuple[str, ...]
    key_from: str = DEFAULT_KEY_FROM
    carry: str | None = None  # None: the whole event
    tag: str = ""  # the script's expect tag: "n:<count>" | "k:<SHA-1 of the keys' JSON>"
    expect_text: str = ""  # the expect in messages: "3 arrivals" | "the keys [...]"
    key_parts: tuple[str, ...] = ()
    carry_parts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        expect: int | tuple[str, ...] = self.expect
        if isinstance(expect, int):
            tag, text = f"n:{expect}", f"{expect} arrival{'s' if expect != 1 else ''}"
        else:
            expect = tuple(sorted(expect, key=str.encode))
            listed = msgspec.json.encode(expect)
            tag, text = f"k:{hashlib.sha1(listed).hexdigest()}", _keys_text(listed, len(expect))
        derived: dict[str, Any] = {
            "expect": expect, "tag": tag, "expect_text": text,
            "key_parts": tuple(JsonPointer(self.key_from).parts),
            "carry_parts": None if self.carry is None else tuple(JsonPointer(self.carry).parts),
        }
        for name, value in derived.items():
            msgspec.structs.force_setattr(self, name, value)

    @property
    def expected(self) -> int:
        return self.expect if isinstance(self.expect, int) else len(self.expect)


def _keys_text(listed: bytes, count: int) -> str:
    text = listed.decode()
    if len(text) > EXPECT_TEXT_CHARS:
        text = f"{text[:EXPECT_TEXT_CHARS]}… ({count} keys)"
    return f"the keys {text}"


# ---- the config ----------------------------------------------------------------------------
def parse_condition(settings: Settings, raw: msgspec.Raw | bytes | None,
                    path: str = "$.condition_config",
                    owner: str | None = None) -> BarrierCondition:
    """Check a raw `condition_config` (a call's, or a trigger's when it is registered, with
    `path` naming where it sits). Missing or bad: BarrierConfig (BARRIER_CONFIG) naming the
    field (`details.path`), the problem and the limit. `owner`: `acl` mode's principal (the
    caller's, a trigger's owner): its barriers are its own, `<owner>/<id>`, so no other
    principal arrives at them or reads what they carry."""
    if raw is None or bytes(raw) == b"null":
        raise BarrierConfig(f"{path}: required: state::barrier needs a condition_config "
                            "{id, expect, key_from?, carry?}", {"path": path})
    shape = validate.request(bytes(raw), BarrierConfigShape, root=path, error=BarrierConfig)
    field = path.removeprefix("$.")
    if not shape.id:
        raise BarrierConfig(f"{path}.id: must not be empty", {"path": f"{path}.id"})
    codec.sized_text(f"{field}.id", shape.id, settings.max_key_bytes, BarrierConfig)
    _check_expect(settings, field, shape.expect)
    for name, pointer in (("key_from", shape.key_from), ("carry", shape.carry)):
        if pointer is not None:
            _check_pointer(f"{field}.{name}", pointer)
    expect = shape.expect if isinstance(shape.expect, int) else tuple(shape.expect)
    return BarrierCondition(id=owned_id(shape.id, owner), expect=expect, key_from=shape.key_from,
                            carry=shape.carry)


def owned_id(barrier_id: str, owner: str | None) -> str:
    """The barrier's id as stored: `acl` mode's principal's own, `<owner>/<id>`."""
    return barrier_id if owner is None else f"{owner}/{barrier_id}"


def _check_expect(settings: Settings, field: str, expect: int | list[str]) -> None:
    where = f"{field}.expect"
    if isinstance(expect, int):
        validate.in_range(where, expect, 1, MAX_EXPECT, " (a count of arrivals)", BarrierConfig)
        return
    validate.in_range(where, len(expect), 1, MAX_EXPECT, " keys", BarrierConfig)
    seen: set[str] = set()
    for i, key in enumerate(expect):
        codec.sized_text(f"{where}[{i}]", key, settings.max_key_bytes, BarrierConfig)
        if key in seen:
            raise BarrierConfig(f"$.{where}[{i}]: `{key}` is listed twice; the keys of a "
                                "barrier are distinct", {"path": f"$.{where}[{i}]"})
        seen.add(key)
    links = sum(LINK_BYTES_PER_KEY * (len(key.encode()) + 1) for key in expect)
    if links > MAX_PAYLOAD_BYTES:
        raise BarrierConfig(
            f"$.{where}: the {len(expect)} named keys take {links} bytes as the barrier keeps "
            f"them until they arrive ({LINK_BYTES_PER_KEY} x (key bytes + 1) each), more than "
            f"the limit of {MAX_PAYLOAD_BYTES} bytes of a barrier (barrier.MAX_PAYLOAD_BYTES); "
            "name fewer or shorter keys, or expect a count",
            {"path": f"$.{where}", "size": links, "limit": MAX_PAYLOAD_BYTES})


def _check_pointer(field: str, pointer: str) -> None:
    codec.sized_text(field, pointer, validate.MAX_TEXT_BYTES, BarrierConfig)
    try:
        JsonPointer(pointer)
    except JsonPointerException as exc:
        raise BarrierConfig(f"$.{field}: `{pointer}` is not a JSON pointer ({exc}); a pointer "
                            "is empty (the whole event) or starts with `/`",
                            {"path": f"$.{field}"}) from exc


# ---- one arrival ---------------------------------------------------------------------------
_MISSING: Any = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")


def _resolve(tree: Any, parts: tuple[str, ...]) -> Any:
    """The value at a JSON pointer's parts, or _MISSING (RFC 6901: an array index is decimal
    without leading zeros; strings and numbers have no members)."""
    for part in parts:
        if isinstance(tree, dict) and part in tree:
            tree = tree[part]
        elif isinstance(tree, list) and _INDEX.fullmatch(part) and int(part) < len(tree):
            tree = tree[int(part)]
        else:
            return _MISSING
    return tree


def _event_tree(event: msgspec.Raw | bytes) -> Any:
    try:
        return codec.decode_exact(bytes(event))
    except codec.LimitExceeded as exc:
        raise InvalidRequest(f"$.event: {exc}", {"path": "$.event", "limit": exc.limit}) from exc
    except ValueError as exc:
        raise InvalidRequest(f"$.event: not valid JSON: {exc}", {"path": "$.event"}) from exc


def arrival_key(settings: Settings, tree: Any, config: BarrierCondition) -> str:
    """The arrival's key: the text at `key_from`, or the compact JSON of any other value."""
    target = _resolve(tree, config.key_parts)
    pointer = config.key_from
    if target is _MISSING or target is None:
        raise InvalidRequest(f"$.event: no arrival key at `{pointer}` (condition_config."
                             "key_from); an arrival needs one", {"path": "$.event",
                                                                 "pointer": pointer})
    key = target if isinstance(target, str) else codec.encode_compact(target).decode()
    size, limit = len(key.encode()), settings.max_key_bytes
    if size > limit:
        raise KeyTooLong(f"$.event: the arrival key at `{pointer}` is {size} bytes, more than "
                         f"the limit of {limit} bytes (max_key_bytes)",
                         {"path": "$.event", "pointer": pointer, "size": size, "limit": limit})
    return key


def carried_json(settings: Settings, tree: Any, config: BarrierCondition) -> bytes:
    """The compact JSON the arrival carries (exact numbers, key order, [] and {} kept)."""
    if config.carry_parts is None:
        return codec.compact_from_tree(tree, "event", settings.max_value_bytes)
    target = _resolve(tree, config.carry_parts)
    return codec.compact_from_tree(None if target is _MISSING else target,
                                   f"event{config.carry}", settings.max_value_bytes)


def barrier_plan(state: RedisState, event: msgspec.Raw | bytes, config: BarrierCondition,
                 token: str | None = None) -> Plan:
    """Record one arrival; the plan's result is a BarrierDecision. `token` identifies the
    arrival: the completing arrival's token, given again, gets its `allow` again."""
    settings = state.settings
    tree = _event_tree(event)
    key = arrival_key(settings, tree, config)
    result = msgspec.json.encode(key) + b":" + carried_json(settings, tree, config)
    part = state.keys.barrier_partition(config.id)
    target = Target(settings, validate.BARRIER_SCOPE, config.id, NO_CONTEXT, barrier=True)

    return _barrier_attempt(state, part, config, key, result, token, target, None)


def _barrier_attempt(state: RedisState, part: PartitionKeys, config: BarrierCondition,
                     key: str, result: bytes, token: str | None, target: Target,
                     named_keys: tuple[str, ...] | None) -> Plan:
    """One run of barrier.lua; a new named barrier asks for its keys, and runs again with
    them. (A module function, not a closure calling itself: that would be a reference cycle
    per arrival, writes.py `_write_attempt`.)"""
    call = barrier_call(part, config.id, key, result, config.tag, config.expected,
                        config.expect_text, token, MAX_PAYLOAD_BYTES, named_keys,
                        state.settings.barrier_ttl_s * 1000)

    def finish(read: BarrierReply) -> Any:
        if read.outcome != "expect":
            return decision(config, key, read)
        if named_keys is not None or isinstance(config.expect, int):
            raise InternalError(f"barrier `{config.id}`: the script asked for its keys twice")
        return _barrier_attempt(state, part, config, key, result, token, target,
                                config.expect)  # a new named barrier: its keys, once

    return state.script_plan(BARRIER, call, finish, target)


def decision(config: BarrierCondition, key: str, reply: BarrierReply) -> BarrierDecision:
    """The typed decision and its reason for the script's reply."""
    where, arrived, expected = f"barrier `{config.id}`", reply.arrived, reply.expected
    if reply.outcome == "allow":
        assert reply.payload is not None
        return BarrierDecision(decision="allow", payload=msgspec.Raw(reply.payload),
                               reason=f"{where} complete ({expected}/{expected})")
    if reply.outcome == "complete":
        reason = f"{where} already complete"
    elif reply.outcome == "counted":
        reason = f"`{key}` already counted, still {arrived}/{expected}"
    elif reply.outcome == "unknown":
        reason = (f"`{key}` is not one of the keys {where} expects: not counted "
                  f"({arrived}/{expected})")
    else:
        left = expected - arrived
        reason = f"{where}: {arrived}/{expected} arrived, waiting on {left} more"
        if reply.missing:
            shown = ", ".join(f"`{k.decode()}`" for k in reply.missing)
            reason += f": {shown}{', …' if left > len(reply.missing) else ''}"
    return BarrierDecision(decision="skip", reason=reason)


# ---- its deletion --------------------------------------------------------------------------
def delete_plan(state: RedisState, barrier_id: str, owner: str | None) -> Plan:
    """state::delete-barrier: the plan's result is a BarrierDeletedResult. `owner`: `acl`
    mode's principal, whose own barriers (`<owner>/<id>`) are the only ones it names."""
    if not barrier_id:
        raise InvalidRequest("$.id: must not be empty (the id of the barrier to delete)",
                             {"path": "$.id"})
    codec.sized_text("id", barrier_id, state.settings.max_key_bytes, KeyTooLong)
    stored = owned_id(barrier_id, owner)
    part = state.keys.barrier_partition(stored)
    target = Target(state.settings, validate.BARRIER_SCOPE, stored, NO_CONTEXT, barrier=True)
    return state.script_plan(DELBARRIER, delbarrier_call(part, stored),
                             lambda read: BarrierDeletedResult(deleted=read.done), target)
