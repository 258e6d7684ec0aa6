"""`state::list_entries` as iii serves it: the pages of an immutable snapshot of one scope.

The first call (no cursor) captures the scope's live entries, in key byte order (iii's order
is its adapter's: its KV store's, or a Redis hash's), and answers the first page; every page
answers a cursor for the next, and the last none. A cursor is an opaque, single-use UUID: the
snapshot is kept in Redis under the name of the cursor that reads it next, in the scope's
partition (keys.PartitionKeys.snapshot), so any replica serves it, and reading a page renames
it to the next cursor's, in the same script (lua/pages.lua): of two calls racing on one cursor
one gets the page, the other INVALID_CURSOR. A cursor serves only the scope, namespace,
caller, `limit` and `max_bytes` it was issued for (`binding`), and only for 120 s after the
capture (pages never extend it). A page holds at most `limit` entries and its JSON at most
`max_bytes` bytes; an entry that cannot fit a page alone is ROW_TOO_LARGE, never skipped.

Bounds (SNAPSHOT_CAPACITY beyond, nothing kept): MAX_SNAPSHOTS live snapshots in a partition,
shared by the callers, PER_CALLER of them at most one caller's (a capture past the caller's
share, or into a full partition where the caller holds some, drops the caller's own oldest
snapshot: one caller opening listings in a loop and never finishing them recycles its own
share and locks no one else out; a full partition where the caller holds none refuses it),
MAX_ENTRIES entries in one (the scope's keys, expired ones not yet reaped included: the script
reads at most one key past the bound, never the whole index), and the bytes of its rows within
the per-call budget `max_call_bytes` (one script reads them all).

The caller is who the call came from (validate.identity: the principal in `acl` mode, else the
bus entry's `caller`); a call with none is UNKNOWN_CALLER, as iii's and as
state::claim-namespace: a cursor must belong to someone. An in-process caller names itself
(`StateStore.call(..., caller=...)`).
"""

from __future__ import annotations

import uuid

import msgspec
from msgspec import Raw

from stateworker.context import CallContext
from stateworker.errors import InvalidCursor, UnknownCaller
from stateworker.schemas import EntriesPage, EntriesPageRequest
from stateworker.scripts.read_bindings import PAGES, PageBounds, pages_call
from stateworker.scripts.replies import PageReply
from stateworker.scripts.statuses import CURSOR_TEXT, Target
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan

MAX_LIMIT = 1000  # entries of a page
MIN_BYTES, MAX_BYTES = 256, 8_000_000  # a page's JSON
MAX_SNAPSHOTS = 16  # live snapshots of one partition (iii: of one worker)
PER_CALLER = 4  # live snapshots of one caller in a partition: its share of MAX_SNAPSHOTS
# Entries of one snapshot: its capture is one script (a snapshot is one point in time), and
# Redis serves no one else meanwhile. 5,000 small entries take ~25 ms; 100,000 took 1.35 s
# (the Lua table of rows grows, and with it the collector's work: 10,000 took ~65 ms).
MAX_ENTRIES = 5_000
LIFE_MS = 120_000  # a snapshot's life from its capture


def caller(ctx: CallContext) -> str:
    """Who the cursor belongs to; a call without a caller is UNKNOWN_CALLER."""
    who = validate.identity(ctx)
    if not who:
        raise UnknownCaller("the call carries no caller: state::list_entries binds its cursor "
                            "to the calling worker (the bus entry's `caller`)",
                            {"path": "caller"})
    return who


def cursor(text: str | None) -> str | None:
    """A cursor as issued: a UUID's text, else INVALID_CURSOR (nothing asked of Redis)."""
    if text is None:
        return None
    try:
        ok = str(uuid.UUID(text)) == text
    except ValueError:
        ok = False
    if not ok:
        raise InvalidCursor(CURSOR_TEXT, {"path": "$.cursor"})
    return text


def state_list_entries(state: RedisState, req: EntriesPageRequest, ctx: CallContext) -> Plan:
    """One page of the scope's snapshot (the first call: the snapshot taken)."""
    validate.scope(state, ctx, req.scope)
    validate.in_range("limit", req.limit, 1, MAX_LIMIT)
    validate.in_range("max_bytes", req.max_bytes, MIN_BYTES, MAX_BYTES)
    held = cursor(req.cursor)
    who = caller(ctx)
    binding = msgspec.json.encode([req.scope, ctx.namespace, who, req.limit,
                                   req.max_bytes]).decode()
    after = str(uuid.uuid4())
    bounds = PageBounds(MAX_ENTRIES, state.settings.max_call_bytes, MAX_SNAPSHOTS, LIFE_MS,
                        MAX_BYTES, PER_CALLER)
    call = pages_call(state.keys.for_scope(req.scope), req.scope, held, after, binding,
                      req.limit, req.max_bytes, bounds, who)

    def finish(page: PageReply) -> EntriesPage:
        return EntriesPage([Raw(row) for row in page.rows], page.done,
                           None if page.done else after, page.offset, page.total)

    return state.script_plan(PAGES, call, finish, Target(state.settings, req.scope, "", ctx))
