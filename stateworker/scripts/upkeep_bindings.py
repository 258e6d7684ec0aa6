"""The bindings of the scripts the service's own upkeep runs, not a caller's call: the leases
and positions of the dispatcher and the snapshot (lease, advance), a set-aside trigger's
mark (aside), the snapshot's reads
(snapread, snaprows, snappage) and its barrier bookkeeping (forget), a restore's markers
(stamp), the packed-entries upgrade (repack), the reaper's (reap; keeptrigger's "reap"), the
console's sessions (session), and where the call streams are (`bus_library`, a library of its
own: the bus may have a Redis of its own) a bus runtime's sweep of dead consumers (sweep) and
the dispatcher's removal of a trigger target's stream nobody needs (droptarget). Each as
bindings.py says of every binding: its script's KEYS and ARGV built in one place, its reply
read into a typed tuple; `bindings.BINDINGS` lists them with the others (the library loads
them all)."""

from __future__ import annotations

from collections.abc import Sequence

from stateworker.clock import now_ms
from stateworker.keys import KeySpace, PartitionKeys
from stateworker.scripts.library import Binding, Library
from stateworker.scripts.replies import (
    Counted,
    Marked,
    Moved,
    Page,
    ReapReply,
    SnapRowsReply,
    Swept,
)
from stateworker.settings import Settings
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import Arg

Call = tuple[list[Arg], list[Arg]]  # a script call's KEYS and ARGV (as bindings.Call)

FORGET = Binding("forget", 1, 0, Counted.read, tail=True)  # KEYS[2..]: the barriers forgotten
LEASE = Binding("lease", 1, 3, Moved.read)
ADVANCE = Binding("advance", 2, 3, Moved.read)
ASIDE = Binding("aside", 2, 5, Marked.read)  # a trigger set aside: its mark (reactive/aside.py)
REPACK = Binding("repack", 1, 1, Counted.read, tail=True)  # the packed-entries upgrade
STAMP = Binding("stamp", 1, 2, Moved.read)  # a restore's generation marker, one slot at a time
SNAPREAD = Binding("snapread", 1, 1, Counted.read)  # a snapshot read counted (or behind: < 0)
REAP = Binding("reap", 3, 5, ReapReply.read)
SNAPROWS = Binding("snaprows", 1, 6, SnapRowsReply.read)  # a snapshot batch and its rows
SNAPPAGE = Binding("snappage", 1, 3, Page.read)  # a page of a stream of unsaved records
SESSION = Binding("session", 2, 5, Counted.read)  # a console session opened or closed
SWEEP = Binding("sweep", 1, 3, Swept.read)  # a group's dead consumers removed (bus/upkeep.py)
DROPTARGET = Binding("droptarget", 1, 0, Counted.read)  # a target stream nobody needs removed
UPKEEP = (REAP, LEASE, ADVANCE, ASIDE, FORGET, REPACK, STAMP, SNAPREAD, SNAPROWS, SNAPPAGE,
          SESSION, SWEEP, DROPTARGET)  # (all)
BUS = (SWEEP, DROPTARGET)  # the scripts run where the call streams are (bus_library)


def bus_library(conn: RedisConnection) -> Library:
    """The library of BUS alone, for `conn` (a bus runtime's, the dispatcher's bus connection:
    reactive/targets.py): the streams may be on a Redis
    of the bus's own, which holds no state library (decision 0056), and a user worker's
    Redis user need not load the state's. Its name is its own digest, the same for every
    process of one version (decision 0068)."""
    return Library(conn, {binding.name: binding.signature for binding in BUS})


def forget_call(changed: str, barriers: Sequence[str], writes: Sequence[str]) -> Call:
    """forget.lua: the partition's changed-barriers set, the barriers stored and the write
    count stored for each (`""`: absent)."""
    return [changed, *barriers], list(writes)


def droptarget_call(stream: str) -> Call:
    """droptarget.lua: remove the call stream `stream` if it holds no call and no consumer."""
    return [stream], []


def lease_call(lease: str, op: str, token: str, lease_ms: int) -> Call:
    """lease.lua: `op` "take", "renew" or "drop"."""
    return [lease], [op, token, lease_ms]


def snapread_call(counter: str, stored: int) -> Call:
    """snapread.lua: count a snapshot read unless the counter is below `stored` (PostgreSQL's)."""
    return [counter], [stored]


def advance_call(lease: str, position: str, token: str, last_id: str, n: int) -> Call:
    """advance.lua: move a follower's position (a hash: id, n) while `token` holds `lease`."""
    return [lease, position], [token, last_id, n]


def aside_call(part: PartitionKeys, token: str, trigger_id: str, mark: tuple[str, int] | None
               ) -> Call:
    """aside.lua: set (or move) `trigger_id`'s mark in `part` to `mark` (the last event id
    handed on for it, its ordinal), or drop it (None), while `token` holds the lease."""
    at, n = mark if mark is not None else ("", "")
    return [part.lease, part.aside], [token, "set" if mark else "drop", trigger_id, at, n]


def snaprows_call(part: PartitionKeys, position: str, most: int, max_bytes: int,
                  tail_most: int, tail_bytes: int) -> Call:
    """snaprows.lua: the batch of at most `most` events and about `max_bytes` (of events and
    entries) after `position`, the entries it changed, and those of the transactions after it
    that wrote one of them (at most `tail_most` events, about `tail_bytes` of them, examined)."""
    return [part.events], [position, most, max_bytes, part.entry_prefix, tail_most, tail_bytes]


def snappage_call(stream: str, start: str, most: int, max_bytes: int) -> Call:
    """snappage.lua: the entries of `stream` from `start` ("(" .. id: after it), at most `most`
    and about `max_bytes` of them."""
    return [stream], [start, most, max_bytes]


def repack_call(part: PartitionKeys, what: str, names: Sequence[Arg]) -> Call:
    """repack.lua: `what` "entries" or "topics", the names of that kind it upgrades."""
    return [part.scopes], [what, *names]


def stamp_call(key: str, kind: str, generation: str) -> Call:
    """stamp.lua: `kind` "h" (`key` a partition's history) or "s" (the registry's marker)."""
    return [key], [kind, generation]


def reap_call(settings: Settings, part: PartitionKeys, batch: int | None = None,
              budget: int | None = None) -> Call:
    """reap.lua: up to `batch` expired entries of `part` (None: settings.reaper_batch), and
    values of about `budget` bytes (None: settings.max_call_bytes)."""
    return ([part.ttl, part.scopes, part.events],
            [now_ms(), settings.reaper_batch if batch is None else batch, part.tag,
             settings.events_maxlen, settings.max_call_bytes if budget is None else budget])


def reap_triggers_call(keys: KeySpace, now: int, batch: int) -> Call:
    """keeptrigger.lua "reap": remove up to `batch` triggers whose lease expired by `now`."""
    return ([keys.triggers, keys.registry, keys.trigger_leases, keys.trigger_owners],
            ["reap", now, batch, "", "", ""])  # (ARGV[4..6] are "keep"'s)


def session_call(keys: KeySpace, digest: str, principal: str, record: bytes | None,
                 ends_ms: int = 0, most: int = 0) -> Call:
    """session.lua: open the session `digest` of `principal` with `record` until `ends_ms`
    (its principal keeping `most` at most), or close it (`record` None)."""
    session, mine = keys.session(digest), keys.sessions_of(principal)
    if record is None:
        return [session, mine], ["close", "", now_ms(), "", ""]
    return [session, mine], ["open", record, now_ms(), ends_ms, most]


def sweep_call(stream: str, group: str, consumer: str, idle_ms: int) -> Call:
    """sweep.lua: remove `group`'s consumers of `stream` with nothing pending, idle longer
    than `idle_ms`, except `consumer` (the sweeper's own)."""
    return [stream], [group, consumer, idle_ms]
