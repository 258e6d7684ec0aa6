"""One binding per Lua script: its KEYS and ARGV built in one place, its reply read into a
typed tuple, and the statuses that become errors turned into them by one table.

Each `Binding` names its script (`lua/<name>.lua`) and how many KEYS the script's header
declares; the library loader checks the two agree when it assembles the library, so a script
and its binding cannot drift apart silently. Argument orders are documented in each script's
header; the builders below are the only code that writes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import LUA_STATUS, STATUS_ERRORS, deadline_text
from stateworker.keys import KeySpace, PartitionKeys, member
from stateworker.settings import Settings
from stateworker.state import registry
from stateworker.state.validate import BARRIER_SCOPE
from stateworker.transport.wire import Arg


@dataclass(frozen=True, slots=True)
class Binding:
    name: str  # lua/<name>.lua
    keys: int  # the most KEYS the script takes (its header's highest KEYS[i])


SET = Binding("set", 9)  # set, compare-and-set, diff; KEYS[8..9] only for bus calls
DELETE = Binding("delete", 9)
UPDATE = Binding("update", 9)
TOPIC = Binding("topic", 9)
SETHASH = Binding("sethash", 1)
REAP = Binding("reap", 3)
LIST = Binding("list", 1)
ENTRIES = Binding("entries", 1)
DELTOPIC = Binding("deltopic", 6)
TRIGGER = Binding("trigger", 2)
CLAIM = Binding("claim", 2)
BARRIER = Binding("barrier", 2)
FORGET = Binding("forget", 1)  # the snapshotter's; KEYS[2..]: the barriers forgotten
LEASE = Binding("lease", 1)  # the dispatcher's (reactive/leases.py)
ADVANCE = Binding("advance", 2)  # the dispatcher's (reactive/dispatcher.py)
BINDINGS = (SET, DELETE, REAP, LIST, UPDATE, SETHASH, TOPIC, DELTOPIC, ENTRIES, TRIGGER, CLAIM,
            BARRIER, LEASE, ADVANCE, FORGET)


# ---- arguments ---------------------------------------------------------------------------------
class Keep:
    """Marks a write that keeps the entry's current topic or expiry."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


def topic_arg(topic: str | Keep | None) -> str:
    """The one topic encoding of every script: "~" keep, "-" clear, "=" + topic set."""
    if isinstance(topic, Keep):
        return "~"
    return "-" if topic is None else "=" + topic


def ttl_arg(ttl_ms: int | Keep | None) -> Arg:
    """Expiry: "" keep the current one, "0" none, else milliseconds from now."""
    if isinstance(ttl_ms, Keep):
        return ""
    return ttl_ms or 0


def optional(value: int | str | None) -> Arg:
    """An optional number or text: "" for none."""
    return "" if value is None else value


def pattern_arg(pattern: str | None) -> str:
    """An optional pattern: "" for none, else "=" + pattern (an empty pattern is a pattern)."""
    return "" if pattern is None else "=" + pattern


def record_arg(settings: Settings, ctx: CallContext) -> str:
    """ARGV[7] of the entry scripts: "<ms kept>|<deadline>|<digest>", "" for an in-process
    call (nothing to record, no deadline)."""
    if ctx.call_id is None and ctx.deadline_ms is None:
        return ""
    deadline = "" if ctx.deadline_ms is None else ctx.deadline_ms
    return f"{settings.dedupe_window_ms}|{deadline}|{ctx.call_digest or '0' * 40}"


def entry_keys(part: PartitionKeys, scope: str, key: str, ctx: CallContext,
               claim: str | None = None) -> list[Arg]:
    """KEYS of an entry script: the entry, its indexes, and for bus calls the call's record
    and the id's binding (`claim`, when the script binds the id itself)."""
    keys: list[Arg] = list(part.entry_keys(scope, key))
    if ctx.call_id is not None:
        keys.append(part.call_record(ctx.call_id))
        if claim is not None:
            keys.append(claim)
    return keys


def entry_args(settings: Settings, scope: str, key: str, ctx: CallContext,
               extra: Sequence[Arg]) -> list[Arg]:
    """ARGV of an entry script: the 7 shared ones, then the script's own."""
    return [scope, key, member(scope, key), now_ms(), settings.events_maxlen, ctx.by or "",
            record_arg(settings, ctx), *extra]


def reap_call(settings: Settings, part: PartitionKeys) -> tuple[list[Arg], list[Arg]]:
    return ([part.ttl, part.scopes, part.events],
            [now_ms(), settings.reaper_batch, part.tag, settings.events_maxlen])


def list_call(part: PartitionKeys, scope: str, what: str) -> tuple[list[Arg], list[Arg]]:
    return [part.key_index(scope)], [now_ms(), part.entry_prefix + member(scope, ""), what]


def deltopic_call(settings: Settings, part: PartitionKeys, scope: str, by: str | None,
                  pattern: str, start: bytes, end: bytes, batch: int
                  ) -> tuple[list[Arg], list[Arg]]:
    return ([part.topic_index(scope), part.key_index(scope), part.updated_index(scope),
             part.scopes, part.ttl, part.events],
            [scope, now_ms(), settings.events_maxlen, by or "", pattern, start, end, batch,
             part.entry_prefix + member(scope, ""), member(scope, "")])


def claim_call(keys: KeySpace, prefix: str, scopes: Sequence[str]
               ) -> tuple[list[Arg], list[Arg]]:
    return [keys.claims, keys.registry], [prefix, registry.MAXLEN, *scopes]


def barrier_call(part: PartitionKeys, barrier_id: str, key: str, result: bytes, tag: str,
                 expected: int, expect_text: str, token: str | None, cap: int,
                 named_keys: Sequence[str] | None) -> tuple[list[Arg], list[Arg]]:
    """barrier.lua: `result` is the key's JSON .. ":" .. its carried JSON; `named_keys` (byte
    order) only when the script asked for them (a new barrier of a named set)."""
    sent: list[Arg] = [""] if named_keys is None else ["1", *named_keys]
    return ([part.barrier(barrier_id), part.barriers_changed],
            [key, result, tag, expected, expect_text, "" if token is None else "=" + token,
             cap, *sent])


# ---- replies -----------------------------------------------------------------------------------
class SetReply(NamedTuple):
    """set.lua. OK: the value replaced and the new version. CONFLICT, UNCHANGED, NEEDS_HASH:
    the current value and version (0 = absent)."""

    status: int
    value: bytes | None
    version: int
    created: bool = False
    revision: bytes | None = None

    @classmethod
    def read(cls, reply: list[Any]) -> SetReply:
        if reply[0] == LUA_STATUS["OK"]:
            return cls(reply[0], reply[1], reply[2], reply[3] == 1, reply[4])
        return cls(reply[0], reply[2], reply[1])


class UpdateReply(NamedTuple):
    """update.lua's OK reply; `positions`: op errors name ops by position (this version's
    form) rather than by index (a record written by an older version)."""

    old_value: bytes | None
    new_value: bytes
    version: int
    created: bool
    written: bool
    op_errors: list[Any]
    positions: bool

    @classmethod
    def read(cls, reply: list[Any]) -> UpdateReply:
        _, old, new, version, created, written, errors, *marker = reply
        return cls(old, new, version, created == 1, written == 1, errors, bool(marker))


class DeleteReply(NamedTuple):
    old_value: bytes | None

    @classmethod
    def read(cls, reply: list[Any]) -> DeleteReply:
        return cls(reply[1])


class TopicReply(NamedTuple):
    found: bool

    @classmethod
    def read(cls, reply: list[Any]) -> TopicReply:
        return cls(bool(reply[1]))


class ReapReply(NamedTuple):
    deleted: int
    more: bool

    @classmethod
    def read(cls, reply: list[Any]) -> ReapReply:
        return cls(int(reply[1]), reply[2] == 1)


class DeltopicReply(NamedTuple):
    deleted: int
    cursor: bytes | None  # the last member examined; None when the range is done

    @classmethod
    def read(cls, reply: list[Any]) -> DeltopicReply:
        return cls(int(reply[1]), reply[2])


class ClaimReply(NamedTuple):
    """claim.lua's OK reply: whether a scope was new, and every scope the prefix owns."""

    claimed: bool
    owned: list[str]

    @classmethod
    def read(cls, reply: list[Any]) -> ClaimReply:
        return cls(reply[1] == 1, [scope.decode() for scope in reply[2]])


class EntriesReply(NamedTuple):
    last_member: bytes | None
    last_score: bytes | None
    skip_left: int
    fields: list[Any]  # 9 per entry (entries.lua)

    @classmethod
    def read(cls, reply: list[Any]) -> EntriesReply:
        return cls(reply[1], reply[2], int(reply[3]), reply[4])


class BarrierReply(NamedTuple):
    """barrier.lua's OK reply: outcome (allow, waiting, counted, unknown, complete, expect),
    keys arrived and expected, the payload (allow), the first missing keys (named sets)."""

    outcome: str
    arrived: int
    expected: int
    payload: bytes | None
    missing: list[bytes]

    @classmethod
    def read(cls, reply: list[Any]) -> BarrierReply:
        return cls(reply[1].decode(), int(reply[2]), int(reply[3]), reply[4], reply[5])


# ---- statuses that are errors ------------------------------------------------------------------
class Target(NamedTuple):
    """What an error message names: the entry, the call and the condition it carried."""

    settings: Settings
    scope: str
    key: str
    ctx: CallContext
    expected_version: int | None = None
    create_only: bool = False


Text = tuple[str, dict[str, Any]]  # an error's message and details


def _conflict(target: Target, reply: list[Any]) -> Text:
    current = reply[1]
    where = f"key {target.key!r} in scope {target.scope!r}"
    details = {"expected_version": target.expected_version or 0, "current_version": current}
    if target.create_only:
        return (f"create_only: {where} already exists (version {current}); nothing was "
                "written", details)
    return (f"expected_version {details['expected_version']} does not match current version "
            f"{current} of {where}", details)


def _too_large(target: Target, reply: list[Any]) -> Text:
    if target.scope == BARRIER_SCOPE:  # barrier.lua: {status, payload size, cap}
        return (f"barrier `{target.key}`: its payload would be {reply[1]} bytes of JSON with "
                f"this arrival, more than the limit of {reply[2]} bytes for a barrier's "
                "payload (barrier.MAX_PAYLOAD_BYTES); nothing was written",
                {"path": "$.event", "size": reply[1], "limit": reply[2]})
    limit = target.settings.max_value_bytes
    return (f"the updated value of key {target.key!r} would be {reply[1]} bytes of JSON, more "
            f"than the limit of {limit} bytes; nothing was written",
            {"path": "$.ops", "size": reply[1], "limit": limit})


def _key_limit(target: Target, reply: list[Any]) -> Text:
    live, limit = reply[1], reply[2]
    return (f"max_keys: scope {target.scope!r} holds {live} live keys and its limit is "
            f"{limit}; key {target.key!r} would be a new one, so nothing was written "
            "(overwriting a key that exists is always allowed)",
            {"path": "$.max_keys", "scope": target.scope, "key": target.key,
             "live_keys": live, "limit": limit})


def _deadline(target: Target, reply: list[Any]) -> Text:
    return deadline_text(target.ctx.deadline_ms)


def _reused(target: Target, reply: list[Any]) -> Text:
    call_id = target.ctx.call_id
    return (f"id {call_id!r} was used for another call (another function or body) in the "
            f"last {target.settings.dedupe_window_ms // 1000} s; a retry must repeat the same "
            "call, a new call needs a new id", {"id": call_id})


def _scope_conflict(target: Target, reply: list[Any]) -> Text:
    scope, owner = reply[1].decode(), reply[2].decode()
    return (f"$.scopes: scope {scope!r} is owned by namespace {owner!r} (the first claimant "
            "keeps a scope); nothing was claimed", {"path": "$.scopes", "scope": scope,
                                                    "owner": owner})


def _barrier_config(target: Target, reply: list[Any]) -> Text:
    stored, given = reply[1].decode(), reply[2].decode()
    return (f"$.condition_config.expect: barrier `{target.key}` expects {stored} (fixed by its "
            f"first arrival), this arrival expects {given}; nothing was written (a new round "
            "needs a new id)",
            {"path": "$.condition_config.expect", "expected": stored, "given": given})


# The message of each error status; its class comes from errors.STATUS_ERRORS (one table of
# status -> exception, shared with the Lua side through LUA_STATUS).
STATUS_TEXTS: dict[int, Callable[[Target, list[Any]], Text]] = {
    LUA_STATUS["CONFLICT"]: _conflict,
    LUA_STATUS["VALUE_TOO_LARGE"]: _too_large,
    LUA_STATUS["DEADLINE_EXCEEDED"]: _deadline,
    LUA_STATUS["CALL_ID_REUSED"]: _reused,
    LUA_STATUS["SCOPE_CONFLICT"]: _scope_conflict,
    LUA_STATUS["BARRIER_CONFIG"]: _barrier_config,
    LUA_STATUS["KEY_LIMIT"]: _key_limit,
}


def raise_for_status(reply: list[Any], target: Target,
                     accept: frozenset[int] = frozenset()) -> None:
    """Raise the error a script's status stands for, unless the caller handles it (`accept`)."""
    status = reply[0]
    error = STATUS_ERRORS.get(status)
    if error is not None and status not in accept:
        raise error(*STATUS_TEXTS[status](target, reply))
