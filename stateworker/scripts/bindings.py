"""One binding per Lua script: its KEYS and ARGV built in one place, its reply read into a
typed tuple (replies.py), its error statuses turned into errors by one table (statuses.py).

A `Binding` names its script (`lua/<name>.lua`), the KEYS and ARGV its header declares (the
library loader checks they agree, so a script and its binding cannot drift apart silently)
and its reply tuple. `Binding.command` is the only code that writes an FCALL; each script's
one builder below gives it the KEYS and ARGV, in its header's order (an entry script's,
`<name>_args`, its own from ARGV[8] on: `entry_call` adds the shared ones); tests/unit/
test_bindings.py holds what each builds to its header. Every key a script touches, named in
its KEYS or built from an ARGV prefix (a scope's entries), carries the hash tag of its first
KEY, so a cluster router can send any command by that key (tests/lua: one slot per call).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from stateworker.clock import now_ms
from stateworker.codec import Value
from stateworker.context import Answer, CallContext
from stateworker.keys import KeySpace, PartitionKeys, call_field, member
from stateworker.scripts.library import Binding, Held, Library
from stateworker.scripts.read_bindings import ENTRIES, GETMANY, LIST, PAGES
from stateworker.scripts.replies import (
    AccessReply,
    BarrierReply,
    ClaimReply,
    ConfigReply,
    DeleteReply,
    DelprefixReply,
    DeltopicReply,
    IndexReply,
    KeptReply,
    Moved,
    ReleaseReply,
    SetReply,
    TopicReply,
    TriggerReply,
    UpdateReply,
)
from stateworker.scripts.upkeep_bindings import UPKEEP
from stateworker.settings import Settings
from stateworker.transport.wire import Arg

R = TypeVar("R")
Call = tuple[list[Arg], list[Arg]]  # a script call's KEYS and ARGV
REGISTRY_MAXLEN = 1000  # registry entries kept (MAXLEN ~): a follower reconnected or trimmed past reloads


# How PostgreSQL holds a script's writes (library.Held): the entry scripts' through their events,
# the registry's through its stream, a barrier's through its partition's changed set.
EVENTS, REGISTRY, MARKED, NONE = Held("stream", 7), Held("stream", 2), Held("marked", 1, 2), \
    Held("none")
# The entry scripts (`entry_call`): set, compare-and-set, diff; KEYS[8..9] for bus calls
# (state::set, delete and update may answer their call: answer_args, last)
SET = Binding("set", 9, 15, SetReply.read, answers=True, held=EVENTS)
DELETE = Binding("delete", 9, 8, DeleteReply.read, answers=True, held=EVENTS)
UPDATE = Binding("update", 9, 13, UpdateReply.read, tail=True, answers=True,
                 held=EVENTS)  # the ops
TOPIC = Binding("topic", 9, 8, TopicReply.read, held=EVENTS)
SETHASH = Binding("sethash", 1, 2, Moved.read)
DELTOPIC = Binding("deltopic", 6, 11, DeltopicReply.read, held=Held("stream", 6))
TRIGGER = Binding("trigger", 4, 11, TriggerReply.read, held=REGISTRY)
KEEP_TRIGGER = Binding("keeptrigger", 4, 6, KeptReply.read,
                       held=REGISTRY)  # keep-trigger, the reaper's
CLAIM = Binding("claim", 2, 6, ClaimReply.read, tail=True, held=REGISTRY)  # scopes, uses
ACCESS = Binding("access", 3, 4, AccessReply.read, tail=True, held=Held("stream", 3))  # roles
RELEASE = Binding("release", 2, 3, ReleaseReply.read, tail=True, held=REGISTRY)  # the scopes
BARRIER = Binding("barrier", 4, 10, BarrierReply.read, tail=True, held=MARKED)  # named keys
DELBARRIER = Binding("delbarrier", 4, 0, Moved.read, held=MARKED)
BIND: Binding[list[Any]] = Binding("bind", 2, 8, list, tail=True)  # an id bound, its reply kept
# state::transaction: its reply is read by state/kv/transactions.py (its layout per branch)
TRANSACTION: Binding[list[Any]] = Binding("transaction", 9, 16, list, tail=True,
                                           held=EVENTS)  # its items
# state::get of a bus call answered by its script: read by state/kv/reads.py
GET: Binding[list[Any]] = Binding("get", 2, 12, list, held=NONE)
DELPREFIX = Binding("delprefix", 9, 13, DelprefixReply.read,
                    held=EVENTS)  # an entry script (KEYS[8..9])
INDEX = Binding("index", 4, 6, IndexReply.read, held=NONE)  # create-, drop-index, the build
CONFIG = Binding("config", 2, 1, ConfigReply.read, tail=True)  # the live settings' overrides
BINDINGS: tuple[Binding[Any], ...] = (
    SET, DELETE, LIST, UPDATE, SETHASH, TOPIC, DELTOPIC, ENTRIES, TRIGGER, KEEP_TRIGGER, CLAIM,
    RELEASE, BARRIER, DELBARRIER, ACCESS, BIND, TRANSACTION, GETMANY, DELPREFIX, GET, INDEX,
    PAGES, CONFIG, *UPKEEP)
# A call's record is looked up in RECORD_SLICES slices before the current one (and the one
# after): lua/includes/records.lua's RECORDS_BACK, the same number.
RECORD_SLICES = 4
DIGEST_BYTES = 8  # raw bytes of a call's digest in its record (entry.lua's ENTRY_DIGEST)


def library_of(conn: Any) -> Library:
    """The library of every binding's script, for `conn`."""
    return Library(conn, {b.name: b.signature for b in BINDINGS})


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


def version_condition(expected_version: int | None, create_only: bool) -> str:
    """set.lua's and transaction.lua's version condition: "" none, "v<N>" (0: absent). Given
    both, both hold: `create_only` with an `expected_version` >= 1 never does ("v-1")."""
    if create_only:
        return "v0" if not expected_version else "v-1"
    return "" if expected_version is None else f"v{expected_version}"


def writer_arg(by: str | None, trace: str | None = None) -> str:
    """The writer argument of the scripts that write events (`by`, "" for none; entry.lua's
    entry_writer reads it): a traced call's (CallContext.trace) is "\0" <traceparent> "\0"
    <writer>, so its events carry `tp`; so is a writer that begins with NUL (an empty
    traceparent then), so no writer reads as a trace."""
    writer = by or ""
    if trace is None and not writer.startswith("\0"):
        return writer
    return f"\0{trace or ''}\0{writer}"


def slice_ms(settings: Settings) -> int:
    """How long one time slice of call records is: a RECORD_SLICES-th of the window."""
    return -(-settings.dedupe_window_ms // RECORD_SLICES)


def call_digest(ctx: CallContext) -> bytes:
    """The call's digest as its record keeps it (DIGEST_BYTES raw bytes of the SHA-1)."""
    return bytes.fromhex(ctx.call_digest or "0" * 40)[:DIGEST_BYTES]


def record_arg(settings: Settings, ctx: CallContext, now: int, field: bytes | None = None,
               answer: Answer | None = None) -> bytes:
    """ARGV[7] of the entry scripts: "<slice ms>|<deadline>|<slice>|<answer>|<field><digest>",
    b"" for an in-process call (nothing to record, no deadline). `field`: the call id's
    (call_field), when known. <answer>: "" the service answers the call, "a" its script does
    (answer_args last), "c" the same on a cluster, once it checked the names are on its node."""
    if ctx.call_id is None and ctx.deadline_ms is None:
        return b""
    ms = slice_ms(settings)
    deadline = "" if ctx.deadline_ms is None else ctx.deadline_ms
    head = f"{ms}|{deadline}|{now // ms}|".encode()
    if ctx.call_id is None:
        return head
    mode = b"|" if answer is None else b"c|" if answer.check else b"a|"
    return head + mode + (field or call_field(ctx.call_id)) + call_digest(ctx)


# ---- KEYS and ARGV of each script ----------------------------------------------------------------
def entry_call(settings: Settings, space: KeySpace, scope: str, key: str, ctx: CallContext,
               cluster: bool, extra: Sequence[Arg], answer: Answer | None = None) -> Call:
    """An entry script (entry.lua's header): KEYS the entry, its indexes, for bus calls the
    current slice of the call's records (one Redis: the id's own bucket, which binds the id
    across partitions too; a cluster: the partition's, which binds it when it is the id's
    home, KeySpace.id_home, else bind_call did before) and, with the snapshot on, the records
    PostgreSQL lacks; ARGV the 7 shared ones, then `extra` (its `<name>_args`). With `answer`
    (its reply list on the state's node) ARGV[7] says so, and answer_args come last."""
    part = space.for_scope(scope)
    address = member(scope, key)
    keys: list[Arg] = [part.entry_prefix + address, *part.scope_keys(scope)]
    now = now_ms()
    field = None if ctx.call_id is None else call_field(ctx.call_id)
    writer = ctx.by or ""
    if ctx.trace is not None or writer.startswith("\0"):  # (else writer_arg's is the writer)
        writer = writer_arg(writer, ctx.trace)
    args: list[Arg] = [scope, key, address, now, settings.events_maxlen, writer,
                       record_arg(settings, ctx, now, field, answer), *extra]
    if field is not None:
        slice_ = now // slice_ms(settings)
        keys.append(part.call_records(slice_) if cluster else space.call_ids(field, slice_))
        if settings.postgres_url:
            keys.append(part.unsaved_calls)
        if answer is not None:
            args += answer_args(answer)
    return keys, args


def set_args(value: Value, topic: str | Keep | None, ttl_ms: int | Keep | None, condition: str,
             diff: bool, max_keys: int | None) -> list[Arg]:
    """set.lua's own ARGV (see its header for `condition`)."""
    return [value.json, value.hash, topic_arg(topic), ttl_arg(ttl_ms), condition,
            "1" if diff else "", "1" if value.plain_strings else "", optional(max_keys)]


def update_args(max_value_bytes: int, expected_version: int | None, topic: str | Keep | None,
                ttl_ms: int | None, op_args: Sequence[Arg], max_keys: int | None) -> list[Arg]:
    """update.lua's own ARGV; `op_args`: state/kv/ops.py encode_ops'."""
    return [max_value_bytes, optional(expected_version), topic_arg(topic), optional(ttl_ms),
            *op_args, optional(max_keys)]


def delete_args(expected_version: int | None) -> list[Arg]:
    return [optional(expected_version)]


def topic_args(topic: str | None) -> list[Arg]:
    return [topic_arg(topic)]


def transaction_args(settings: Settings, part: PartitionKeys, scope: str, tx_id: str,
                     max_keys: int | None, lists: Sequence[tuple[int, Sequence[Arg]]]
                     ) -> list[Arg]:
    """transaction.lua's own ARGV: the scope's prefixes, the id ("": each op on its own), the
    limits, and each list of items (compare, ops, else ops: its count, its items' ARGV)."""
    return [part.entry_prefix + member(scope, ""), member(scope, ""), tx_id,
            settings.max_value_bytes, optional(max_keys), *(count for count, _ in lists),
            settings.max_call_bytes, *(arg for _, items in lists for arg in items)]


def answer_args(answer: Answer) -> list[Arg]:
    """The last six ARGV of a script that answers its call (lua/includes/answer.lua): names,
    not KEYS, as on a cluster they are in other slots than the state's."""
    return [answer.reply, answer.stream, 0 if answer.publish else answer.ttl_ms, answer.group,
            answer.entry_id,
            answer.head]


def get_call(settings: Settings, space: KeySpace, scope: str, key: str, ctx: CallContext,
             answer: Answer, cluster: bool) -> Call:
    """get.lua: a bus call's state::get, its id bound and its reply sent by the script (on a
    cluster only for an id at home in the scope's partition: KEYS[1] shares its slot)."""
    field, now, ms = call_field(ctx.call_id or ""), now_ms(), slice_ms(settings)
    return ([space.binding(field, now // ms, cluster), space.for_scope(scope).entry(scope, key)],
            [ms, now // ms, now, field, call_digest(ctx), "c" if answer.check else "",
             *answer_args(answer)])


def bind_call(settings: Settings, space: KeySpace, ctx: CallContext, cluster: bool,
              mode: str, claim_end: int | None = None, last: Arg = "") -> Call:
    """bind.lua for a call with an id: bound to its digest where ids are bound
    (KeySpace.binding: its bucket, or on a cluster its home partition's records). `mode`:
    "r" a read's binding, kept unlogged (decision 0058); "b" a binding alone; "w" a write's
    claim until `claim_end` (`last`: its deadline, "" none); "k" its reply `last` kept in
    place of the claim (state/core/once.py)."""
    field, now, ms = call_field(ctx.call_id or ""), now_ms(), slice_ms(settings)
    return ([space.binding(field, now // ms, cluster)],
            [ms, now // ms, now, field, call_digest(ctx), mode, optional(claim_end), last])


def kept_call(claim: Call, reply: bytes, unsaved: tuple[str, int, bytes] | None = None,
              mode: str = "k") -> Call:
    """bind.lua "k": a claim's (`claim`, its "w" call) reply kept in its place, in the very
    slice the claim was made in (the slice may have turned since); `unsaved` (the snapshot
    on): the stream the record goes to for PostgreSQL, its MAXLEN and what PostgreSQL must
    hold first (state/core/once.py `Needs`). `mode` "u" (`reply` b""): the claim let go."""
    keys, args = claim
    if unsaved is None:
        return keys, [*args[:5], mode, args[6], reply]
    stream, cap, needs = unsaved
    return [*keys, stream], [*args[:5], "k", args[6], reply, cap, needs]


def sethash_call(part: PartitionKeys, scope: str, key: str, version: int, digest: str) -> Call:
    return [part.entry(scope, key)], [version, digest]








def deltopic_call(settings: Settings, part: PartitionKeys, scope: str, writer: str,
                  pattern: str, start: bytes, end: bytes, batch: int) -> Call:
    """deltopic.lua; `writer`: writer_arg's (the writer and the call's trace)."""
    return ([part.topic_index(scope), part.key_index(scope), part.updated_index(scope),
             part.scopes, part.ttl, part.events],
            [scope, now_ms(), settings.events_maxlen, writer, pattern, start, end, batch,
             part.entry_prefix + member(scope, ""), member(scope, ""), settings.max_call_bytes])


def trigger_call(keys: KeySpace, op: str, trigger_id: str, registration: bytes | str,
                 cap: int, owner: str | None = None, admin: bool = False, *, now: int,
                 expires: int | None = None, cap_bytes: int = 0,
                 share: tuple[int, int] = (0, 0)) -> Call:
    """trigger.lua: `op` "set" (with the registration's JSON) or "del"; `owner`: the principal
    asking (None: a trusted caller), `admin`: it may change anyone's; `now` (ms): a lease
    expired by then is gone; `expires` (ms): a "set" registration's lease (None: none);
    `cap_bytes`: a "set"'s most bytes of every registration's JSON together; `share`: a
    "set"'s most registrations and bytes of one owner."""
    return ([keys.triggers, keys.registry, keys.trigger_leases, keys.trigger_owners],
            [op, trigger_id, registration, cap, owner or "", "1" if admin else "", now,
             "" if expires is None else expires, cap_bytes, *share])


def keep_trigger_call(keys: KeySpace, now: int, trigger_id: str, held: bytes,
                      renewed: bytes, expires: int) -> Call:
    """keeptrigger.lua "keep": `held` (as read) becomes `renewed`, leased until `expires`."""
    return ([keys.triggers, keys.registry, keys.trigger_leases, keys.trigger_owners],
            ["keep", now, trigger_id, held, renewed, expires])




def claim_call(keys: KeySpace, prefix: str, scopes: Sequence[str], uses: Sequence[str],
               adopter: str | None, per_namespace: int, in_all: int) -> Call:
    """claim.lua: `uses[i]` is `scopes[i]`'s use ("" free, "<entries>:<why>" in use);
    `adopter`: the admin adopting scopes in use (None: none is taken); a namespace owns at
    most `per_namespace` scopes, all of them together at most `in_all`."""
    return ([keys.claims, keys.registry],
            [prefix, REGISTRY_MAXLEN, "" if adopter is None else "=" + adopter, len(scopes),
             per_namespace, in_all, *scopes, *uses])


def release_call(keys: KeySpace, caller: str, force: bool, scopes: Sequence[str]) -> Call:
    """release.lua: `caller` releases its own scopes; `force`: any namespace's (an admin)."""
    return [keys.claims, keys.registry], [caller, "1" if force else "", REGISTRY_MAXLEN, *scopes]


def access_call(keys: KeySpace, op: str, name: str, record: bytes | str,
                roles: Sequence[str] = ()) -> Call:
    """access.lua: `op` principal-add|-set|-del or role-set|-del; `roles`: the stored roles a
    principal's record names (each must exist)."""
    return ([keys.principals, keys.roles, keys.registry],
            [op, name, record, REGISTRY_MAXLEN, *roles])


def barrier_call(part: PartitionKeys, barrier_id: str, key: str, result: bytes, tag: str,
                 expected: int, expect_text: str, token: str | None, cap: int,
                 named_keys: Sequence[str] | None, kept_ms: int) -> Call:
    """barrier.lua: `result` is the key's JSON .. ":" .. its carried JSON; `named_keys` (byte
    order) only when the script asked for them (a new barrier of a named set); `kept_ms`: how
    long a completed barrier is kept."""
    return ([part.barrier(barrier_id), part.barriers_changed, part.barrier_writes, part.barriers],
            [key, result, tag, expected, expect_text, "" if token is None else "=" + token,
             cap, "" if named_keys is None else "1", now_ms(), kept_ms, *(named_keys or ())])


def delbarrier_call(part: PartitionKeys, barrier_id: str) -> Call:
    """delbarrier.lua: delete one barrier."""
    return [part.barrier(barrier_id), part.barriers_changed, part.barrier_writes,
            part.barriers], []












def delprefix_args(part: PartitionKeys, scope: str, prefix: bytes, limit: int,
                   budget: int) -> list[Arg]:
    """delprefix.lua's own ARGV (`entry_call`'s key: the prefix): at most `limit` entries whose
    key starts with `prefix`, and values of at most about `budget` bytes."""
    return [part.entry_prefix + member(scope, ""), member(scope, ""), b"[" + prefix,
            b"(" + prefix + b"\xff", limit, budget]


def index_call(part: PartitionKeys, scope: str, op: str, pointer: str, count: int,
               budget: int = 0) -> Call:
    """index.lua: `op` create (`count`: most indexes of a scope), build (`count`: most keys of
    a batch, `budget`: most bytes of entries it reads) or drop."""
    return ([part.index_defs(scope), part.key_index(scope), part.value_index(scope, pointer),
             part.index_builds],
            [op, pointer, part.entry_prefix + member(scope, ""), count, member(scope, pointer),
             budget])












def config_call(keys: KeySpace, overrides: Sequence[tuple[str, str]]) -> Call:
    """config.lua: `overrides` (name, value text; "" removes one) written, every replica told."""
    return ([keys.live_settings, keys.registry],
            [REGISTRY_MAXLEN, *(item for pair in overrides for item in pair)])
