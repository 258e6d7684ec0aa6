"""The registry follower: how every replica learns of a change to what the service keeps in
memory (claimed scopes, triggers) within a moment, without polling the keys that hold it.

A script that changes such a thing also XADDs one entry to the registry stream
(`<prefix>:{<prefix>:reg}:registry`, `MAXLEN ~ MAXLEN`) with a field `kind` (`claims`,
`triggers` ...) and whatever else its kind needs. Each replica runs one `Registry.run` loop
on a connection of its own: `XREAD BLOCK` from the last entry it saw, handing each entry to
the `apply` callback registered for its kind (`on`); kinds nobody registered are skipped.

Nothing missed counts: at start and after every failed read (a reconnect, a Redis restart)
the loop first notes the stream's last id, then calls every kind's `reload` (read all from
the keys), then follows from that id. A change made in between is both in the reload and
applied again, so `apply` must be idempotent (an overlay of the change, not a toggle). A
follower held up while the trim passed its position reloads the same way (`_trimmed_past`).
`reload` and `apply` never run at the same time (one lock), so a reload cannot install a
snapshot older than a change already applied.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import anyio
from anyio.abc import TaskStatus

from stateworker.errors import Unavailable
from stateworker.events.compaction import lost_after, stream_info
from stateworker.events.model import revision_of
from stateworker.scripts.bindings import REGISTRY_MAXLEN
from stateworker.transport.connect import connection_like
from stateworker.transport.connection import RedisConnection
from stateworker.transport.retry import Backoff
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.state.core.registry")

MAXLEN = REGISTRY_MAXLEN  # entries kept (MAXLEN ~): a follower reconnected or trimmed past reloads
READ_COUNT = MAXLEN  # entries one read takes (at most MAXLEN: a full one is checked for a trim)
BLOCK_MS = 1000  # one XREAD's wait; an entry wakes it at once, so this bounds nothing else
RELOAD = "reload"  # the kind of an entry that makes every replica reload every kind (a restore)


class RegistryEntry(NamedTuple):
    """One registry entry: its stream id, its `kind` and all its fields (UTF-8 text)."""

    id: str
    kind: str
    fields: dict[str, str]


Reload = Callable[[], Awaitable[None]]
Apply = Callable[[RegistryEntry], Awaitable[None]]


class Registry:
    """The registry stream of one prefix and the kinds followed on this replica."""

    def __init__(self, conn: RedisConnection, stream: str) -> None:
        """`conn`: whose URL and timeouts the follower's own connection copies."""
        self.stream = stream
        self._conn = conn
        self._kinds: dict[str, tuple[Reload, Apply]] = {}
        self._lock = anyio.Lock()
        self.last_id = "0-0"  # the last entry handed on (or noted before a reload)

    def on(self, kind: str, reload: Reload, apply: Apply) -> None:
        """Follow `kind`: `reload()` reads everything of it from Redis (at start and after a
        reconnect), `apply(entry)` applies one entry (idempotently). A kind registered after
        the loop started is loaded at its next reconnect: call `reload(kind)` once after
        `on` to load it now."""
        self._kinds[kind] = (reload, apply)

    async def reload(self, kind: str | None = None) -> None:
        """Run the `reload` of `kind` (None: of every kind), never beside an `apply`."""
        async with self._lock:
            for name, (load, _) in list(self._kinds.items()):
                if kind is None or name == kind:
                    await load()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Follow the stream until cancelled. Started once every kind is loaded.

        Raises:
            Unavailable (UNAVAILABLE): Redis failed the first load (the state does not open).
        """
        conn = connection_like(self._conn)
        try:
            try:
                await self._sync(conn)
            except (ConnectionLost, ReplyError) as exc:
                raise Unavailable(f"loading the registry ({self.stream}) failed: {exc}",
                                  {"stream": self.stream}) from exc
            task_status.started()
            await self._follow(conn)
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def _sync(self, conn: RedisConnection) -> None:
        """Note the last id first, then reload: what lands in between is read twice, never
        missed."""
        newest = await conn.execute("XREVRANGE", self.stream, "+", "-", "COUNT", 1)
        self.last_id = newest[0][0].decode() if newest else "0-0"
        await self.reload()

    async def _follow(self, conn: RedisConnection) -> None:
        backoff = Backoff()
        while True:
            try:
                if backoff.failures:
                    await self._sync(conn)
                reply = await conn.execute("XREAD", "COUNT", READ_COUNT, "BLOCK", BLOCK_MS,
                                           "STREAMS", self.stream, self.last_id)
                if backoff.failures:
                    log.info("following the registry again (reloaded)",
                             extra={"event": "registry.recovered"})
                    backoff.reset()
                entries = reply[0][1] if reply else []
                if len(entries) >= READ_COUNT and await self._trimmed_past(conn):
                    continue  # (reloaded: what the read holds is in the reload)
                for entry_id, flat in entries:
                    await self._hand_on(_entry(entry_id, flat))
            except (ConnectionLost, ReplyError) as exc:
                if not backoff.failures:  # one line per outage
                    log.warning("following the registry failed: %s; retrying with backoff",
                                exc, extra={"event": "registry.read_failed"})
                await anyio.sleep(backoff.next())

    async def _trimmed_past(self, conn: RedisConnection) -> bool:
        """After a full read: whether the trim took entries this follower had not read yet
        (a follower held up while more than MAXLEN entries were added: an entry was slow to
        apply, the process stalled). Then it resyncs (the last id noted, every kind
        reloaded): followed on, it would never learn of a claim, a role or a setting whose
        entry was trimmed. (Only a full read can follow such a trim: `MAXLEN ~` keeps at
        least MAXLEN entries, all of them after the position.)"""
        reply = await conn.execute("XINFO", "STREAM", self.stream)
        if not lost_after(revision_of(self.last_id), None, stream_info(reply, self.stream)):
            return False
        log.warning("the registry was trimmed past entries this replica had not read: "
                    "reloading every kind", extra={"event": "registry.trimmed"})
        await self._sync(conn)
        return True

    async def _hand_on(self, entry: RegistryEntry) -> None:
        """Apply one entry; one that cannot be applied makes its kind reload (never a dead
        follower; Redis failing that reload is a failed read: resync after a backoff)."""
        self.last_id = entry.id
        if entry.kind == RELOAD:  # (a restore wrote every kind's keys anew)
            await self.reload()
            return
        callbacks = self._kinds.get(entry.kind)
        if callbacks is None:
            return  # a kind this replica does not follow (another version's)
        reload, apply = callbacks
        async with self._lock:
            try:
                await apply(entry)
            except Exception as exc:  # a malformed entry, Redis away mid-apply
                log.warning("registry entry %s (%s) not applied: %s; reloading", entry.id,
                            entry.kind, exc, extra={"event": "registry.apply_failed"})
                await reload()


def _entry(entry_id: bytes, flat: list[bytes]) -> RegistryEntry:
    text = [item.decode(errors="replace") for item in flat]
    fields = dict(zip(text[::2], text[1::2], strict=False))
    return RegistryEntry(entry_id.decode(), fields.get("kind", ""), fields)
