"""The statuses every script returns first in its reply, and what becomes of them: the Lua
`ST` table (written into the library from `LUA_STATUS`, so the two sides cannot disagree),
the checked reply, and the exception and message of each error status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from stateworker.context import CallContext
from stateworker.errors import (
    STORE_LOST_TEXT,
    BarrierConfig,
    CallIdReused,
    CallTooLarge,
    Conflict,
    DeadlineExceeded,
    Forbidden,
    InternalError,
    InvalidCursor,
    InvalidRequest,
    InvalidScope,
    KeyLimit,
    RowTooLarge,
    ScopeConflict,
    ScopeInUse,
    SnapshotCapacity,
    StateError,
    StoreLost,
    ValueTooLarge,
    deadline_text,
    shown,
    store_lost_read,
)
from stateworker.settings import Settings
from stateworker.transport.plans import redis_error
from stateworker.transport.wire import ReplyError

# The statuses scripts return first in their reply; the scripts read them as ST.<name>.
LUA_STATUS: dict[str, int] = {
    "OK": 0,
    "CONFLICT": 1,  # a version or value condition did not hold; nothing written
    "VALUE_TOO_LARGE": 2,  # the value a script built is over max_value_bytes; nothing written
    "UNCHANGED": 3,  # state::diff: same hash, nothing written
    "NEEDS_HASH": 4,  # the stored hash is unknown (after an update); store it and retry
    "DUPLICATE": 5,  # the bus call ran before: its recorded reply, nothing changed
    "DEADLINE_EXCEEDED": 6,  # the bus call's deadline passed and it never ran; nothing written
    "CALL_ID_REUSED": 7,  # the call id's record belongs to another call; nothing written
    "BARRIER_CONFIG": 8,  # the barrier exists with another `expect`; nothing written
    "SCOPE_CONFLICT": 9,  # a scope asked for is owned by another namespace; nothing written
    "KEY_LIMIT": 10,  # a new key would pass the scope's max_keys; nothing written
    "SCOPE_IN_USE": 11,  # a public scope to claim is in use, no adoption; nothing written
    "FORBIDDEN": 12,  # release: a scope's owner is not the caller; nothing written
    "INVALID_SCOPE": 13,  # release: a scope no namespace claimed; nothing written
    "TX_ABORTED": 14,  # a transaction's op failed (its status follows); nothing written
    "OP_FAILED": 15,  # (in TX_ABORTED) an update op could not apply; nothing written
    "ANSWERED": 16,  # the script wrote the bus call's reply and acknowledged it (Answer)
    "STORE_LOST": 17,  # this Redis lost the prefix's data (generation.lua); nothing written
    "CALL_TOO_LARGE": 18,  # the call's values read and written pass max_call_bytes; nothing written
    "INVALID_CURSOR": 19,  # pages.lua: the cursor's snapshot is not there for it; nothing written
    "SNAPSHOT_CAPACITY": 20,  # pages.lua: a snapshot past its bounds; nothing written
    "ROW_TOO_LARGE": 21,  # pages.lua: the next row fits no page alone; nothing written
    "UNHEARD": 22,  # answer.lua: the reply published and no one listened; the service answers
    "INVALID_REQUEST": 23,  # claim.lua: the claims would pass a limit; nothing written
}

# The statuses that are errors, and the exception each becomes; the others are outcomes.
STATUS_ERRORS: dict[int, type[StateError]] = {
    LUA_STATUS["CONFLICT"]: Conflict,
    LUA_STATUS["VALUE_TOO_LARGE"]: ValueTooLarge,
    LUA_STATUS["DEADLINE_EXCEEDED"]: DeadlineExceeded,
    LUA_STATUS["CALL_ID_REUSED"]: CallIdReused,
    LUA_STATUS["BARRIER_CONFIG"]: BarrierConfig,
    LUA_STATUS["SCOPE_CONFLICT"]: ScopeConflict,
    LUA_STATUS["KEY_LIMIT"]: KeyLimit,
    LUA_STATUS["SCOPE_IN_USE"]: ScopeInUse,
    LUA_STATUS["FORBIDDEN"]: Forbidden,
    LUA_STATUS["INVALID_SCOPE"]: InvalidScope,
    LUA_STATUS["STORE_LOST"]: StoreLost,  # (raised by script_reply, for every script)
    LUA_STATUS["CALL_TOO_LARGE"]: CallTooLarge,
    LUA_STATUS["INVALID_CURSOR"]: InvalidCursor,
    LUA_STATUS["SNAPSHOT_CAPACITY"]: SnapshotCapacity,
    LUA_STATUS["ROW_TOO_LARGE"]: RowTooLarge,
    LUA_STATUS["INVALID_REQUEST"]: InvalidRequest,
}
# TX_ABORTED and OP_FAILED become errors in the transaction's plan (state/kv/transactions.py),
# which names the op: the error is that of the op's own status.
OUTCOME_STATUSES = frozenset({"OK", "UNCHANGED", "NEEDS_HASH", "DUPLICATE", "TX_ABORTED",
                              "OP_FAILED", "ANSWERED", "UNHEARD"})



def lua_status_table() -> str:
    """The Lua source of the `ST` table, prepended to every script by the loader."""
    fields = ", ".join(f"{name} = {value}" for name, value in LUA_STATUS.items())
    return f"local ST = {{ {fields} }}\n"


_KNOWN_STATUSES = frozenset(LUA_STATUS.values())
_STORE_LOST = LUA_STATUS["STORE_LOST"]


def script_reply(reply: Any, name: str) -> list[Any]:
    """A script's reply, checked: a Redis error (out of memory: RESOURCE_EXHAUSTED), a Redis
    that lost the prefix's data (STORE_LOST, from any writing script, and from a read script
    where the data is lost or being restored) or an unknown status is raised."""
    if isinstance(reply, ReplyError):
        raise redis_error(reply, f"script {name}")
    if not isinstance(reply, list) or not reply or reply[0] not in _KNOWN_STATUSES:
        raise InternalError(f"script {name} returned an unexpected reply: {reply!r:.200}")
    if reply[0] == _STORE_LOST:
        if len(reply) == 3:  # a read's (generation_read_refused): the prefix, restoring or not
            raise store_lost_read(reply[1].decode(), reply[2] == 1)
        raise StoreLost(STORE_LOST_TEXT, {"recover": "stateworker restore"})
    return reply


# ---- statuses that are errors ------------------------------------------------------------------
class Target(NamedTuple):
    """What an error message names: the entry, the call and the condition it carried."""

    settings: Settings
    scope: str
    key: str
    ctx: CallContext
    expected_version: int | None = None
    create_only: bool = False
    barrier: bool = False  # the key is a barrier's id (barrier.lua), not an entry's key


Text = tuple[str, dict[str, Any]]  # an error's message and details


def _conflict(target: Target, reply: list[Any]) -> Text:
    current = reply[1]
    where = f"key {shown(target.key)} in scope {shown(target.scope)}"
    details = {"expected_version": target.expected_version or 0, "current_version": current}
    if target.create_only and target.expected_version:
        return (f"create_only and expected_version {target.expected_version} never both hold "
                f"(create_only: the key must be absent, version 0); current version {current} "
                f"of {where}; nothing was written", details)
    if target.create_only:
        return (f"create_only: {where} already exists (version {current}); nothing was "
                "written", details)
    return (f"expected_version {details['expected_version']} does not match current version "
            f"{current} of {where}", details)


def _too_large(target: Target, reply: list[Any]) -> Text:
    if target.barrier:  # barrier.lua: {status, payload size, cap}
        return (f"barrier `{target.key}`: its payload would be {reply[1]} bytes of JSON with "
                f"this arrival, more than the limit of {reply[2]} bytes for a barrier's "
                "payload (barrier.MAX_PAYLOAD_BYTES); nothing was written",
                {"path": "$.event", "size": reply[1], "limit": reply[2]})
    limit = target.settings.max_value_bytes
    return (f"the updated value of key {shown(target.key)} would be {reply[1]} bytes of JSON, more "
            f"than the limit of {limit} bytes; nothing was written",
            {"path": "$.ops", "size": reply[1], "limit": limit})


def _key_limit(target: Target, reply: list[Any]) -> Text:
    live, limit = reply[1], reply[2]
    return (f"max_keys: scope {shown(target.scope)} holds {live} live keys and its limit is "
            f"{limit}; key {shown(target.key)} would be a new one, so nothing was written "
            "(overwriting a key that exists is always allowed)",
            {"path": "$.max_keys", "scope": target.scope, "key": target.key,
             "live_keys": live, "limit": limit})


def _deadline(target: Target, reply: list[Any]) -> Text:
    return deadline_text(target.ctx.deadline_ms)


def _reused(target: Target, reply: list[Any]) -> Text:
    call_id = target.ctx.call_id
    return (f"id {shown(call_id)} was used for another call (another function or body) in the "
            f"last {target.settings.dedupe_window_ms // 1000} s; a retry must repeat the same "
            "call, a new call needs a new id", {"id": call_id})


def _scope_conflict(target: Target, reply: list[Any]) -> Text:
    scope, owner = reply[1].decode(), reply[2].decode()
    return (f"$.scopes: scope {shown(scope)} is owned by namespace {shown(owner)} (the first claimant "
            "keeps a scope); nothing was claimed", {"path": "$.scopes", "scope": scope,
                                                    "owner": owner})


def _scope_in_use(target: Target, reply: list[Any]) -> Text:
    # claim.lua: {status, scope, "<entries>:<why>"}, the use as the claim's read step found it
    scope = reply[1].decode()
    entries, _, why = reply[2].decode().partition(":")
    return (f"$.scopes: scope {shown(scope)} is public and in use ({why}); a claim would take it "
            "from its users, so nothing was claimed (an admin may adopt it: `adopt: true`)",
            {"path": "$.scopes", "scope": scope, "entries": int(entries), "reason": why})


def _claim_limit(target: Target, reply: list[Any]) -> Text:
    # claim.lua: {status, "namespace" | "all", the scopes owned with the new ones, the limit}
    which, owned, limit = reply[1].decode(), int(reply[2]), int(reply[3])
    whose = ("the namespace would own" if which == "namespace"
             else "the namespaces would own together")
    return (f"$.scopes: {whose} {owned} scopes, more than the limit of {limit}"
            f"{' a namespace' if which == 'namespace' else ' in all'}; nothing was claimed "
            "(release some first: state::release-namespace)",
            {"path": "$.scopes", "limit": limit, "scopes": owned, "of": which})


def _caller(ctx: CallContext) -> str | None:
    return ctx.principal if ctx.principal is not None else ctx.caller


def _not_owner(target: Target, reply: list[Any]) -> Text:
    # release.lua: {status, scope, owner}
    scope, owner, caller = reply[1].decode(), reply[2].decode(), _caller(target.ctx)
    return (f"$.scopes: scope {shown(scope)} is owned by namespace {shown(owner)}, not by the caller "
            f"{shown(caller)}: only its owner releases it (an admin: with `force: true`); nothing "
            "was released", {"path": "$.scopes", "scope": scope, "owner": owner,
                             "caller": caller})


def _not_claimed(target: Target, reply: list[Any]) -> Text:
    # release.lua: {status, scope}
    scope = reply[1].decode()
    return (f"$.scopes: scope {shown(scope)} is not claimed by any namespace (it is public); "
            "nothing was released", {"path": "$.scopes", "scope": scope})


def _barrier_config(target: Target, reply: list[Any]) -> Text:
    stored, given = reply[1].decode(), reply[2].decode()
    return (f"$.condition_config.expect: barrier `{target.key}` expects {stored} (fixed by its "
            f"first arrival), this arrival expects {given}; nothing was written (a new round "
            "needs a new id)",
            {"path": "$.condition_config.expect", "expected": stored, "given": given})


def _call_too_large(target: Target, reply: list[Any]) -> Text:
    """transaction.lua: {status, op index, bytes by then, the limit}."""
    index, size, limit = reply[1], reply[2], reply[3]
    return (f"the call would read and write more than {limit} bytes of values by its op "
            f"{index} ({size} bytes: the stored values its ops read and the new ones they "
            "write), more than the limit of one call (max_call_bytes, "
            "STATEWORKER_MAX_CALL_BYTES); nothing was written: split it into smaller calls",
            {"op_index": index, "size": size, "limit": limit})


CURSOR_TEXT = ("$.cursor: not a live cursor of this listing: unknown, expired (a snapshot lives "
               "120 s), already read (each page gives the next one), dropped (a caller keeps "
               "at most 4 live listings in a partition: a newer one drops its oldest), or "
               "issued for another scope, caller, limit or max_bytes; list again without a "
               "cursor")


def _invalid_cursor(target: Target, reply: list[Any]) -> Text:
    return CURSOR_TEXT, {"path": "$.cursor"}


_BOUNDS = {"snapshots": ("live snapshots of the scope's partition, none of them the caller's "
                         "(a caller holding some gives back its own oldest)",
                         "pages.MAX_SNAPSHOTS"),
           "entries": ("entries of one snapshot", "pages.MAX_ENTRIES"),
           "bytes": ("bytes of one snapshot's entries", "max_call_bytes, "
                     "STATEWORKER_MAX_CALL_BYTES")}


def _snapshot_capacity(target: Target, reply: list[Any]) -> Text:
    """pages.lua: {status, what, found, the limit}."""
    what, found, limit = reply[1].decode(), reply[2], reply[3]
    told, name = _BOUNDS[what]
    return (f"state::list_entries of scope {shown(target.scope)}: a snapshot would pass the "
            f"limit of {limit} {told} ({name}; found {found}); nothing was kept: list a "
            "smaller scope, or again once a snapshot expires (120 s) or is read to its end",
            {"path": "$.scope", "limit": limit, "found": found, "bound": what})


def _row_too_large(target: Target, reply: list[Any]) -> Text:
    """pages.lua: {status, the row's position, its bytes, the limit}."""
    position, size, limit = reply[1], reply[2], reply[3]
    return (f"$.max_bytes: entry {position} of the listing is {size} bytes of JSON as a row "
            f"([key, value]), more than a page of max_bytes {limit} holds with it; it is never "
            "skipped: list it with a larger max_bytes (at most 8000000), or read it with "
            "state::get", {"path": "$.max_bytes", "offset": position, "size": size,
                           "limit": limit})


# The message of each error status; its class comes from STATUS_ERRORS above (one table of
# status -> exception, shared with the Lua side through LUA_STATUS).
STATUS_TEXTS: dict[int, Callable[[Target, list[Any]], Text]] = {
    LUA_STATUS["CONFLICT"]: _conflict,
    LUA_STATUS["VALUE_TOO_LARGE"]: _too_large,
    LUA_STATUS["DEADLINE_EXCEEDED"]: _deadline,
    LUA_STATUS["CALL_ID_REUSED"]: _reused,
    LUA_STATUS["SCOPE_CONFLICT"]: _scope_conflict,
    LUA_STATUS["BARRIER_CONFIG"]: _barrier_config,
    LUA_STATUS["KEY_LIMIT"]: _key_limit,
    LUA_STATUS["SCOPE_IN_USE"]: _scope_in_use,
    LUA_STATUS["FORBIDDEN"]: _not_owner,
    LUA_STATUS["INVALID_SCOPE"]: _not_claimed,
    LUA_STATUS["STORE_LOST"]: lambda target, reply: (STORE_LOST_TEXT, {}),
    LUA_STATUS["CALL_TOO_LARGE"]: _call_too_large,
    LUA_STATUS["INVALID_CURSOR"]: _invalid_cursor,
    LUA_STATUS["SNAPSHOT_CAPACITY"]: _snapshot_capacity,
    LUA_STATUS["ROW_TOO_LARGE"]: _row_too_large,
    LUA_STATUS["INVALID_REQUEST"]: _claim_limit,
}


def raise_for_status(reply: list[Any], target: Target,
                     accept: frozenset[int] = frozenset()) -> None:
    """Raise the error a script's status stands for, unless the caller handles it (`accept`)."""
    status = reply[0]
    error = STATUS_ERRORS.get(status)
    if error is not None and status not in accept:
        raise error(*STATUS_TEXTS[status](target, reply))
