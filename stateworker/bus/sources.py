"""The streams one `BusRuntime` reads, and where its reader stands in each.

`off` mode (and every user worker): the service's `<prefix>:bus:<service>`, or with
STATEWORKER_BUS_SHARDS > 1 each of its shards (keys.bus_shard_stream; every replica reads
every shard, each with its own position, group and reclaim).
`acl` mode (the state service): besides it, one stream per principal,
`<prefix>:bus:<service>:from:<principal>` (keys.principal_stream), each with a consumer group
named after the service. The principals come from a callable (the state's `Access` cache,
which the registry follower keeps current), asked once per read: a principal added while the
service runs is read from its next read on, with no restart. The call's identity is the
stream it came from (`Source.principal`); in `acl` mode the shared stream is closed: its
entries are answered with PERMISSION_DENIED and acknowledged, never run.

A position per stream: "0" while the reader reads its own pending history of that stream
(after a start or a failed read: calls it read but did not answer), an entry id to go on
after, and ">" once it reads new entries only.

The consumer groups: made at start (and again when one vanished), a dead consumer's entries
taken over (XAUTOCLAIM), and dead consumers with nothing pending removed (sweep.lua).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, NamedTuple

from stateworker.bus.entries import Parsed, parse_entry
from stateworker.bus.protocol import Bus, BusOptions, Ref
from stateworker.errors import InvalidRequest, PermissionDenied, shown
from stateworker.keys import principal_reply_prefix, principal_stream
from stateworker.scripts.library import Library
from stateworker.scripts.replies import Swept
from stateworker.scripts.upkeep_bindings import SWEEP, sweep_call
from stateworker.transport.connection import RedisConnection
from stateworker.transport.plans import pipeline
from stateworker.transport.wire import ConnectionLost, ReplyError

HISTORY, NEW = "0", ">"


class Source(NamedTuple):
    """One stream read: its name and whose it is (None: the service's shared stream)."""

    stream: str
    principal: str | None


class Sources:
    """The streams of one service (`principals` None: the shared stream alone)."""

    def __init__(self, prefix: str, service: str, shared: str | Sequence[str],
                 principals: Callable[[], Iterable[str]] | None = None) -> None:
        """`shared`: the service's stream, or its shards' streams (shard 0 first)."""
        self.prefix = prefix
        self.service = service
        self.shards = [Source(stream, None)
                       for stream in ([shared] if isinstance(shared, str) else shared)]
        self.shared = self.shards[0]
        self._principals = principals
        self._known: frozenset[str] | None = None
        self.by_stream: dict[str, Source] = {s.stream: s for s in self.shards}
        self.positions: dict[str, str] = {s.stream: HISTORY for s in self.shards}

    @property
    def closed_shared(self) -> bool:
        """`acl` mode: calls on the shared stream are refused (they name no principal)."""
        return self._principals is not None

    def changed(self) -> list[Source]:
        """Bring the streams up to the principals known now; the new sources (to create the
        consumer group on) are returned, removed ones are dropped."""
        if self._principals is None:
            return []
        known = frozenset(self._principals())
        if known == self._known:
            return []
        self._known = known
        wanted = {principal_stream(self.prefix, self.service, name): name for name in known}
        for stream in [s for s, src in self.by_stream.items() if src.principal is not None]:
            if stream not in wanted:
                del self.by_stream[stream]
                self.positions.pop(stream, None)
        added = [Source(stream, name) for stream, name in wanted.items()
                 if stream not in self.by_stream]
        for source in added:
            self.by_stream[source.stream] = source
            self.positions[source.stream] = HISTORY
        return added

    def drop(self, stream: str) -> None:
        """Stop reading `stream` (it vanished) until the principals change again."""
        source = self.by_stream.get(stream)
        if source is not None and source.principal is not None:
            self.by_stream.pop(stream, None)
            self.positions.pop(stream, None)
            self._known = None  # asked again at the next read: re-added if still known

    def all_history(self) -> None:
        """Read every stream's pending history again (after a failed read or write)."""
        for stream in self.positions:
            self.positions[stream] = HISTORY

    def read_args(self) -> tuple[list[str], list[str]]:
        """The streams of an XREADGROUP and the position of each (`STREAMS s1 s2 … p1 p2 …`)."""
        streams = list(self.positions)
        return streams, [self.positions[s] for s in streams]

    def advance(self, read: dict[str, list[tuple[bytes, list[bytes] | None]]]) -> None:
        """After a read: a stream read from its history goes on after the last entry read,
        or to new entries once its history is done."""
        for stream, position in self.positions.items():
            if position != NEW:
                entries = read.get(stream)
                self.positions[stream] = entries[-1][0].decode() if entries else NEW

    def refused(self, source: Source) -> PermissionDenied | None:
        """Why a call on `source` is not run at all, or None."""
        if source.principal is None and self.closed_shared:
            return PermissionDenied(
                f"stream {shown(source.stream)} is closed in acl mode: a principal writes its calls "
                f"to {principal_stream(self.prefix, self.service, '<principal>')}, the one "
                "stream its Redis user may write to", {"stream": source.stream})
        return None

    def reply_allowed(self, source: Source, reply_key: bytes) -> bool:
        """A principal's calls are answered only on its own reply lists."""
        if source.principal is None:
            return True
        return reply_key.startswith(principal_reply_prefix(self.prefix,
                                                           source.principal).encode())


def read_call(ref: Ref, flat: list[bytes], options: BusOptions, bus: Bus, sources: Sources,
              source: Source, in_script: frozenset[str] = frozenset()) -> Parsed:
    """An entry read from `source` as a Call, or the error it gets (and where, to which id,
    whether in msgpack: parse_entry). A call whose reply list is not one of this prefix's (in
    `acl` mode: of its principal's) is not run at all, and its reply is not written
    (`ReplyWriter.queue`); a call on a closed shared stream is not run. `in_script`: the
    functions whose script writes the call's reply and acknowledges it itself
    (context.Answer)."""
    parsed = parse_entry(ref, flat, options, source.principal, bus.group, in_script)
    call, reply_key, call_id, _, msgpack = parsed
    if reply_key and not sources.reply_allowed(source, reply_key):
        # Another principal's list: never written to, not even a malformed call's error.
        return None, b"", call_id, None, msgpack
    if call is None:
        return parsed
    if reply_key and not bus.reply_allowed(reply_key):
        return None, reply_key, call_id, InvalidRequest(
            f"reply: must be a list key under {bus.reply_prefix}", {"path": "reply"}), msgpack
    refused = sources.refused(source)
    if refused is not None:
        return None, reply_key, call_id, refused, msgpack
    return parsed


# ---- the consumer groups ------------------------------------------------------------------------
async def create_groups(conn: RedisConnection, sources: Sources, group: str) -> None:
    """At start: the group on every stream (made when missing). Raises ReplyError (a name
    that holds another type) and ConnectionLost."""
    sources.changed()
    for source in list(sources.by_stream.values()):
        await _create_group(conn, sources, group, source, make=True)


async def follow_principals(conn: RedisConnection, sources: Sources, group: str) -> None:
    """Before each read: the streams of principals added since are read from now on."""
    for source in sources.changed():
        with contextlib.suppress(ReplyError):  # (another type at the name: not read)
            await _create_group(conn, sources, group, source, make=True)


async def recover_groups(conn: RedisConnection, sources: Sources, group: str) -> None:
    """After a failed read: the groups that vanished again (Redis restarted without its
    data, a stream deleted); a principal's stream that is gone is not made again (it was
    removed: `principal remove` deletes it once drained)."""
    with contextlib.suppress(ConnectionLost, ReplyError):  # the next read reports it
        for source in list(sources.by_stream.values()):
            await _create_group(conn, sources, group, source, make=source.principal is None)


async def _create_group(conn: RedisConnection, sources: Sources, group: str, source: Source,
                        *, make: bool) -> None:
    command: list[str] = ["XGROUP", "CREATE", source.stream, group, "0"]
    try:
        await conn.execute(*command, *(["MKSTREAM"] if make else []))
    except ReplyError as exc:
        if str(exc).startswith("BUSYGROUP"):
            return
        if source.principal is not None and not make:
            sources.drop(source.stream)  # gone: not read until the principals change
            return
        raise


async def claimed_entries(conn: RedisConnection, sources: Sources, group: str, consumer: str,
                          idle_ms: int, room: Callable[[], int]
                          ) -> AsyncIterator[tuple[Source, list[Any], list[bytes]]]:
    """XAUTOCLAIM over every stream: (source, entries taken over from a dead consumer, ids
    deleted from the stream meanwhile), batch by batch while `room()` (calls that may start)
    is positive."""
    for source in list(sources.by_stream.values()):
        cursor: Any = "0-0"
        while room() > 0:
            try:
                cursor, entries, *rest = await conn.execute(
                    "XAUTOCLAIM", source.stream, group, consumer, idle_ms, cursor, "COUNT",
                    min(256, room()))
            except ReplyError as exc:
                if source.principal is None or not str(exc).startswith("NOGROUP"):
                    raise
                break  # (a principal's stream removed meanwhile: nothing to take over)
            yield source, entries, rest[0] if rest else []
            if cursor in (b"0-0", "0-0"):
                break


async def swept_consumers(conn: RedisConnection, library: Library, sources: Sources,
                          group: str, consumer: str, idle_ms: int) -> list[Swept | ReplyError]:
    """sweep.lua on every stream's group, in one pipeline (the library loaded where it is
    missing): each stream's consumers removed and left, or Redis's refusal (NOPERM ...).
    Raises Unavailable (Redis away)."""
    commands = [SWEEP.command(library, *sweep_call(stream, group, consumer, idle_ms))
                for stream in sources.by_stream]
    replies = await pipeline(conn, library, commands) if commands else []
    return [reply if isinstance(reply, ReplyError) else SWEEP.read(reply) for reply in replies]
