"""Every Redis key and stream name, built in one place: a partition's (`PartitionKeys`), the
registry's, the dispatchers', the snapshot's and the call records' (`KeySpace`), the bus's
(`BusKeys`, `bus_stream` ..., `acl` mode's `principal_*`). The map of them all, a row a name
(its type and what it holds), is docs/architecture.md's "Key layout": a new name gets its row.

Scopes hash (CRC32 of their UTF-8 bytes) into a fixed number of partitions. Every key of one
partition carries the Redis Cluster hash tag `{<prefix>:p<n>}`, so each script, which touches
one entry and the indexes and event stream of its partition, runs on a single cluster slot.
The scope is length-prefixed inside entry names (`member`), so any scope and key (":" included)
map to one name and the reaper can split a ttl member back into scope and key.
"""

from __future__ import annotations

import functools
import hashlib
import re
import zlib
from dataclasses import dataclass

from stateworker.codec import whole_number
from stateworker.errors import shown


# eq=False: hashed by identity (one per partition): scope_keys's cache hashes it every call.
@dataclass(frozen=True, slots=True, eq=False)
class PartitionKeys:
    """The names shared by every scope of one partition."""

    tag: str  # "sw:{sw:p3}:" -- every name of the partition starts with it
    scopes: str
    ttl: str
    events: str
    entry_prefix: str  # + "<len>:<scope><key>" gives an entry
    lease: str  # the dispatcher that holds the partition: its token, PX lease time
    dispatched: str  # the dispatcher's position: id and ordinal of the last event handed on
    cut: str  # events the hard cap trimmed before they were dispatched: count, last id
    aside: str  # hash: trigger id -> "<id> <n>", its mark while set aside (reactive/aside.py)
    snapshot_lease: str  # the snapshotter that holds the partition: its token, PX lease time
    snapshotted: str  # the snapshot's position (id, n) as committed in PostgreSQL
    barriers_changed: str  # set: barrier hashes changed, not yet stored (if followed: `history`)
    barrier_writes: str  # counter: the last `w` a barrier write (or deletion) of it took
    # zset: the partition's barrier hashes by when they expire (ms; "+inf": not complete), kept
    # by barrier.lua and delbarrier.lua, the expired dropped by the reaper: the console's list
    barriers: str
    snapshot_reads: str  # counter: the snapshot's reads of it (snapshot/behind.py)
    # zset: the partition's scopes by the ms of their last change event, also when every entry
    # has gone since (state::claim-namespace: a scope written within the dedupe window is in use).
    # entry.lua's entry_emit writes it as (KEYS[5] less "scopes") .. "written"; the reaper
    # drops members older than the window.
    written: str
    # hash: where this Redis's event history of the partition begins (events/compaction.py,
    # `History`), written when the prefix is new in this Redis and by a restore; HISTORY_* below.
    history: str

    def barrier(self, barrier_id: str) -> str:
        """One barrier's state (`KeySpace.barrier_partition` picks the partition)."""
        return f"{self.barrier_prefix}{barrier_id}"

    @property
    def barrier_prefix(self) -> str:  # + "<barrier id>": a barrier's hash (`barrier_id_of`)
        return f"{self.tag}b:"

    def barrier_id_of(self, name: bytes) -> str:
        return name.decode()[len(self.barrier_prefix):]

    def entry(self, scope: str, key: str) -> str:
        return f"{self.entry_prefix}{member(scope, key)}"

    def snapshot(self, cursor: str) -> str:
        """A state::list_entries snapshot, named by the cursor that reads it next (lua/pages.lua),
        for 120 s from its capture (state/kv/pages.py `LIFE_MS`)."""
        return f"{self.tag}snap:{cursor}"

    @property
    def snapshots(self) -> str:
        """zset: the partition's live snapshots (their names) by expiry ms."""
        return f"{self.tag}snaps"

    def key_index(self, scope: str) -> str:
        return f"{self.tag}k:{scope}"

    def updated_index(self, scope: str) -> str:
        return f"{self.tag}u:{scope}"

    def topic_index(self, scope: str) -> str:
        return f"{self.tag}t:{scope}"

    def index_defs(self, scope: str) -> str:
        """hash: the scope's indexes, pointer -> "r" (ready), "b" (build not started) or "c" + the
        last key built. lua/includes/indexes.lua makes it as the key index's name, "ix:" for "k:"."""
        return f"{self.tag}ix:{scope}"

    def value_index(self, scope: str, pointer: str) -> str:
        """zset (score 0): one indexed pointer's members, "<encoded value><key>"
        (state/query/predicates.py `encode`); made by indexes.lua as "iv:<len>:<scope><pointer>"."""
        return f"{self.tag}iv:{member(scope, pointer)}"

    @property
    def index_builds(self) -> str:
        """zset (score 0): "<len>:<scope><pointer>" of the partition's indexes still building
        (index.lua; `stateworker status` shows their progress)."""
        return f"{self.tag}ixbuilding"

    def call_records(self, slice_: int) -> str:
        """On a Redis Cluster: one time slice of the partition's call records (a hash)."""
        return f"{self.tag}calls:{slice_}"

    @property
    def unsaved_calls(self) -> str:
        """Records of calls that changed the partition, until PostgreSQL holds them."""
        return f"{self.tag}unsaved_calls"

    @property
    def unsaved_kept(self) -> str:
        """The kept replies of writes that run no entry script (state/core/once.py) of the call
        ids at home in the partition, until PostgreSQL holds them and their writes (snapshot/kept.py)."""
        return f"{self.tag}unsaved_kept"

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one PartitionKeys per partition, kept
    def scope_keys(self, scope: str) -> tuple[str, ...]:
        """KEYS[2..7] of the entry scripts: the scope's indexes, the partition's keys."""
        return (self.key_index(scope), self.updated_index(scope), self.topic_index(scope),
                self.scopes, self.ttl, self.events)


FIELD_BYTES = 12
CALL_BUCKETS = 64  # buckets of call ids: a slice's hash, expired whole, frees 1/64 of them


def call_field(call_id: str) -> bytes:
    """A call id's field in its records: FIELD_BYTES bytes of its SHA-1, as small as a record can
    be (Redis's smallest string, 16 bytes with its header); two of 10**8 ids meet at 6e-14."""
    return hashlib.sha1(call_id.encode()).digest()[:FIELD_BYTES]


# A partition's history hash's other fields: its generation marker (state/generation.py), a restore's
# (lua/stamp.lua), a snapshot following its barriers (includes/barriermarks.lua, snapshot/barriers.py).
HISTORY_GENERATION, HISTORY_RESTORING, HISTORY_SNAPSHOT = "gen", "restoring", "snapshot"


def member(scope: str, key: str) -> str:
    """The length-prefixed scope+key used in entry names and the ttl index."""
    return f"{len(scope.encode())}:{scope}{key}"


def split_member(name: bytes) -> tuple[str, str]:
    """`member`'s (scope, key): `<len>:<scope><key>`, len in UTF-8 bytes."""
    length, _, rest = name.partition(b":")
    return rest[:int(length)].decode(), rest[int(length):].decode()


class KeySpace:
    """Builds the names for one prefix and partition count."""

    def __init__(self, prefix: str, partitions: int) -> None:
        self.prefix, self.partitions = prefix, partitions
        self.meta = f"{prefix}:meta"
        self._calls = f"{prefix}:calls:"
        # The registry's keys share one hash tag: a change and its registry entry are one script.
        registry_tag = f"{prefix}:{{{prefix}:reg}}:"
        self.registry = f"{registry_tag}registry"  # stream: one entry per trigger/claim change
        self.triggers = f"{registry_tag}triggers"
        self.trigger_leases = f"{registry_tag}trigger_leases"  # id -> expires ms: the reaper's index
        # "n|<owner>", "b|<owner>" -> its registrations, their bytes (lua/includes/shares.lua)
        self.trigger_owners = f"{registry_tag}trigger_owners"
        self.claims = f"{registry_tag}claims"
        self.principals = f"{registry_tag}principals"  # name -> JSON (roles, act_as): no password
        self.roles = f"{registry_tag}roles"
        # The generation marker (state/generation.py; generation.lua: the registry less "registry")
        self.registry_marker = f"{registry_tag}generation"
        self.live_settings = f"{registry_tag}settings"  # name -> override (state::on-config-change)
        self.registry_reads = f"{registry_tag}snapshot_reads"  # (snapshot/behind.py)
        # hash: the registry's copy committed in PostgreSQL: id (its stream's last entry then)
        self.registry_snapshotted = f"{registry_tag}snapshotted"
        self._sessions = f"{registry_tag}session"  # acl mode: the console's (app/logins.py)
        self.replicas = f"{prefix}:replicas"
        self.serving = f"{prefix}:serving"  # hash: live serves' shared settings (state/layout.py)
        self.dispatch_stats = f"{prefix}:dispatch:stats"
        self.dispatch_targets = f"{prefix}:dispatch:targets"  # set: services given a group
        # "<id>|delivered", "|error" (JSON), "|waiting", "|cut" (set aside); pruned as they go
        self.dispatch_by_trigger = f"{prefix}:dispatch:by_trigger"
        self.snapshot_replicas = f"{prefix}:snapshot:replicas"
        self.snapshot_status = f"{prefix}:snapshot:status"
        self._parts = [self._build(n) for n in range(partitions)]
        self._positions = {p.events: p.snapshotted for p in self._parts}
        self._positions[self.registry] = self.registry_snapshotted

    def session(self, digest: str) -> str:  # a console session, by its token's SHA-256 (hex)
        return f"{self._sessions}:{digest}"

    def sessions_of(self, principal: str) -> str:  # its sessions' keys, by when they end
        return f"{self._sessions}s:{principal}"

    def _build(self, n: int) -> PartitionKeys:
        tag = f"{self.prefix}:{{{self.prefix}:p{n}}}:"
        return PartitionKeys(
            tag=tag,
            scopes=f"{tag}scopes",
            ttl=f"{tag}ttl",
            events=f"{tag}events",
            entry_prefix=f"{tag}e:",
            lease=f"{tag}lease",
            dispatched=f"{tag}dispatched",
            cut=f"{tag}cut",
            aside=f"{tag}aside",
            snapshot_lease=f"{tag}snapshot_lease",
            snapshotted=f"{tag}snapshotted",
            barriers_changed=f"{tag}barriers_changed",
            barrier_writes=f"{tag}barrier_writes",
            barriers=f"{tag}barriers",
            snapshot_reads=f"{tag}snapshot_reads",
            written=f"{tag}written",
            history=f"{tag}history",
        )

    def bus_stream(self, service: str) -> str:
        """The call stream of `service` (a trigger's handler calls go there)."""
        return bus_stream(self.prefix, service)

    def call_ids(self, field: bytes, slice_: int) -> str:
        """One time slice of the records of the call ids of `field`'s bucket (a hash;
        `call_field`). On one Redis it binds an id to its first call across every partition,
        and holds the entry scripts' records. Its own hash tag per bucket."""
        return f"{self._calls}{{{self.prefix}:c{field[0] % CALL_BUCKETS}}}:{slice_}"

    def id_home(self, field: bytes) -> int:
        """The partition whose records bind a call id on a Redis Cluster (`field`: the id's
        call_field): a function of the id alone, so an id reused in any partition meets its
        binding there. A call whose id's home is its scope's partition is bound by its entry
        script with its record, in one slot; a client picks such ids (bus/ids.py)."""
        return int.from_bytes(field[1:3], "big") % self.partitions

    def binding(self, field: bytes, slice_: int, cluster: bool) -> str:
        """The time slice that binds call id `field` to its call: on one Redis its bucket
        (`call_ids`), on a cluster its home partition's records (`id_home`)."""
        if cluster:
            return self._parts[self.id_home(field)].call_records(slice_)
        return self.call_ids(field, slice_)

    def snapshotted_of(self, stream: str) -> str | None:
        """The hash that holds the snapshot's committed position in `stream` (a partition's
        events, the registry; field `id`); None for any other name."""
        return self._positions.get(stream)

    def partition_of(self, scope: str) -> int:
        return zlib.crc32(scope.encode()) % self.partitions

    def for_scope(self, scope: str) -> PartitionKeys:
        return self._parts[self._partition_of(scope)]

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one KeySpace per store, kept
    def _partition_of(self, scope: str) -> int:
        return self.partition_of(scope)

    def barrier_partition(self, barrier_id: str) -> PartitionKeys:
        """Barriers spread over the partitions by their id (not all in `state_barrier`'s)."""
        return self._parts[zlib.crc32(barrier_id.encode()) % self.partitions]

    def partition(self, n: int) -> PartitionKeys:
        return self._parts[n]

    def all_partitions(self) -> list[PartitionKeys]:
        return list(self._parts)


STATE_SERVICE = "state"  # the state service's name on the bus (its stream, its group)


class BusKeys:
    """The names of one service on the bus: its call stream (and consumer group), its
    counters, the reply lists, and a user worker's call records."""

    def __init__(self, prefix: str, service: str, shards: int = 1) -> None:
        self.prefix = prefix
        self.service = service
        self.stream = bus_stream(prefix, service)  # shard 0 (and its records' head)
        self.streams = [bus_shard_stream(prefix, service, n) for n in range(shards)]
        self.group = service
        self.stats_key = stats_key(prefix, service)
        self.reply_prefix = reply_prefix(prefix)

    def record(self, call_id: str) -> str:
        """A user worker's record of a call's reply (the state service records in-script)."""
        return f"{self.stream}:done:{{{call_id}}}"


def bus_stream(prefix: str, service: str) -> str:
    """A service's call stream (its consumer group is named after the service)."""
    return f"{prefix}:bus:{service}"


def bus_shard_stream(prefix: str, service: str, shard: int) -> str:
    """Shard `shard` of a service's call streams (STATEWORKER_BUS_SHARDS). Shard 0 is the
    service's stream as it always was (`bus_stream`: one shard changes no name); shard i > 0
    ends in partition i's hash tag, so on a Redis Cluster it shares partition i's slot (a call
    is sent to the shard of its scope's partition: docs/bus-protocol.md, "Shards")."""
    if shard == 0:
        return bus_stream(prefix, service)
    return f"{bus_stream(prefix, service)}:{{{prefix}:p{shard}}}"


def bus_shard_of_stream(prefix: str, stream: str) -> tuple[str, int]:
    """(service, shard) of a call stream's name (`bus_shard_stream` read back; a name with
    no shard tag is shard 0 of the service after `<prefix>:bus:`)."""
    service = stream[len(bus_stream(prefix, "")):]
    head, brace, tail = service.rpartition(f":{{{prefix}:p")
    shard = whole_number(tail[:-1], 6) if brace and tail.endswith("}") else None
    if shard is not None:
        return head, shard
    return service, 0


def reply_prefix(prefix: str) -> str:
    """Reply lists: `<prefix>:reply:<client id>`; the only keys a service replies to."""
    return f"{prefix}:reply:"


def reply_list_on(reply_key: str, n: int) -> str:
    """One of a client's reply lists on a Redis Cluster, `<reply key>:{<reply key>:<n>}`: a
    slot of its own, `n` counted up until that slot is on the node wanted (bus/routes.py).
    Not a partition's slot: a partition's slot moved (a resharding) never takes a reply list
    along, whose script could write it on the new node while the old node still held it."""
    return f"{reply_key}:{{{reply_key}:{n}}}"


def stats_key(prefix: str, service: str) -> str:
    return f"{prefix}:stats:{service}"


# The bus's name rules for what a call is sent to (a trigger's service and function): a
# service is the tail of a stream's name and the name of its consumer group, and a worker's
# records are `<stream>:done:{<call id>}`, so a brace would move the hash tag, `:done:` would
# meet a worker's records, and `/`, NUL and whitespace have no place in a name a shell,
# an ACL pattern or a log line carries.
MAX_SERVICE_BYTES = 64
MAX_FUNCTION_BYTES = 256  # a function id (`fn` of a call entry, a trigger's function_id)
# (":from:" ends a service's name in a principal's stream: a trigger naming
# `state:from:<principal>` would put calls into that principal's own stream)
_BANNED = (("{", "'{'"), ("}", "'}'"), (":done:", "':done:'"), (":from:", "':from:'"),
           ("\0", "NUL (\\u0000)"), ("/", "'/'"))
BUS_NAME_RULES = "no '{', '}', ':done:', ':from:', NUL, '/' or whitespace"


def bus_name_problem(name: str) -> str | None:
    """What breaks the bus's name rules in `name` (a service or function id), None if nothing."""
    for banned, text in _BANNED:
        if banned in name:
            return f"contains {text}"
    for char in name:
        if char.isspace():
            return f"contains whitespace ({shown(char)})"
    return None


def bus_streams_pattern(prefix: str) -> str:
    """SCAN pattern of every service's call stream."""
    return f"{prefix}:bus:*"


# A principal's name: its Redis ACL user, the tail of its streams and the head of its reply
# lists, and (as a namespace's functions prefix) the namespace it may claim.
PRINCIPAL_RE = re.compile(r"\A[A-Za-z0-9_-]{1,64}\Z")  # (\Z: no newline at the end)
_FROM = ":from:"


def principal_stream(prefix: str, service: str, principal: str) -> str:
    """`acl` mode: the one stream `principal` may XADD its calls to `service` to."""
    return f"{bus_stream(prefix, service)}{_FROM}{principal}"


def principal_streams_pattern(prefix: str, service: str) -> str:
    """SCAN / ACL pattern of every principal's stream to `service`."""
    return f"{bus_stream(prefix, service)}{_FROM}*"


def principal_of_stream(prefix: str, service: str, stream: str) -> str | None:
    """The principal whose stream to `service` `stream` is; None when it is none."""
    head = f"{bus_stream(prefix, service)}{_FROM}"
    if not stream.startswith(head):
        return None
    name = stream[len(head):]
    return name if PRINCIPAL_RE.match(name) else None


def principal_reply_prefix(prefix: str, principal: str) -> str:
    """`acl` mode: `principal`'s reply lists (`<prefix>:reply:<principal>:<client id>`), the
    only ones its ACL user may read and the only ones the service answers its calls on."""
    return f"{reply_prefix(prefix)}{principal}:"


def principal_own_streams_pattern(prefix: str, principal: str) -> str:
    """`acl` mode: the ACL key pattern of every stream `principal` may XADD to (its stream to
    each service). A name holds no glob character (PRINCIPAL_RE), nor does a prefix."""
    return f"{prefix}:bus:*{_FROM}{principal}"


def principal_reply_pattern(prefix: str, principal: str) -> str:
    """`acl` mode: the ACL key pattern of `principal`'s reply lists."""
    return f"{principal_reply_prefix(prefix, principal)}*"
