"""`StateClient`: calls functions over the bus. One reply list per client (on a Redis Cluster
one per node: bus/routes.py), read by one task each that hands each reply to the call
waiting for its id (bus/reply_reader.py); a retry reuses the
call's id, so the service applies it at most once and answers it the same way. Its typed
`state::*` helpers are in bus/typed.py.

Every call carries its deadline (`deadline_ms`, epoch ms: now + its timeout, unless given), so
a call the client gave up on is never applied later. Redis that cannot serve for a while (a
refused or broken connection, LOADING after a restart, BUSY, TRYAGAIN, CLUSTERDOWN,
MASTERDOWN) costs a retry with backoff within the call's timeout, never the client: past the
timeout the call raises UNAVAILABLE when it never reached the stream, TIMEOUT when it may
have (see `call_json`). How a call is sent and re-sent, and until when (half the service's
dedupe window), is bus/resends.py's (`Resends`, a mixin of `StateClient`); this module holds
the client's connections, its reply readers and its faces."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping
from contextlib import AsyncExitStack, suppress
from types import TracebackType
from typing import Any

import anyio

from stateworker import pyvalues, tracing
from stateworker.bus.ids import CallIds, body_partition
from stateworker.bus.protocol import caller_route, caller_shards
from stateworker.bus.reply_reader import ReplyReader, Waiter
from stateworker.bus.resends import WINDOW_REFRESH_S, Resends, fallback_window_ms
from stateworker.bus.routes import Routes
from stateworker.bus.typed import TypedCalls
from stateworker.errors import Unavailable
from stateworker.events.watch import Watch
from stateworker.keys import stats_key
from stateworker.settings import Settings
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_for, connection_like, probed
from stateworker.transport.connection import check_url
from stateworker.transport.embedded import bus_url, client_url
from stateworker.transport.redis_clock import follow_clock, may_read_clock, sync_clock
from stateworker.transport.retry import open_ready, transient_reason
from stateworker.transport.subscriber import Subscriber
from stateworker.transport.wire import ConnectionLost, ReplyError


class StateClient(Resends, TypedCalls):
    """`async with StateClient() as client: await client.set("s", "k", 1)`

    Every call raises the StateError of its error reply (`errors.error_from`: the class of
    its code, RemoteError for a code without one), CallTimeout (TIMEOUT) when no reply came
    within its timeout though it may have been sent, Unavailable (UNAVAILABLE) when it never
    reached the stream (Redis unavailable all along) or the client closed first. The typed
    helpers list the codes their function answers with.

    `transient` counts the transient Redis states the client met and rode out, by kind
    (`CONNECTION`, `LOADING`, `BUSY` ...): what a dashboard may want to watch.
    """

    def __init__(self, redis_url: str | None = None, *, service: str = "state",
                 timeout: float = 10.0, retries: int = 2, caller: str | None = None,
                 settings: Settings | None = None) -> None:
        """A client; nothing connects before `async with`.

        Args:
            redis_url: `redis://host:port/db` or `unix:///path.sock`; default
                STATEWORKER_REDIS_URL, else the embedded Redis's socket under `state_dir`.
                With STATEWORKER_BUS_REDIS_URL set, the bus is there instead (the bus on a
                Redis of its own).
            service: whose stream calls go to (`<prefix>:bus:<service>`; with
                STATEWORKER_BUS_SHARDS > 1 the shard each call's scope, else its id, picks:
                docs/bus-protocol.md, "Shards"); a Worker's name to call its functions.
            timeout: a call's overall time in seconds (all its sends and retries); also how
                long `async with` waits for a Redis that is restarting or loading.
            retries: re-sends within that time while no reply came (at even intervals; each
                re-sends the call with the same id and deadline); a transient Redis error
                re-sends after its backoff besides. None later than half the service's dedupe
                window after the first send: a call's record is kept a window after it ran,
                and a re-send read after that would apply it again. The service tells its
                window (read at connect, then every minute: bus/resends.py); unknown (`acl`
                mode, a service not started), the client's own `dedupe_window_ms` is taken, at
                most the default (15 min).
            caller: recorded as the writer (`updated_by`, the event's `by`) of every call;
                the worker `claim_namespace` claims for.
            settings: all settings at once (then `redis_url` and the environment are ignored).

        Raises:
            ConfigError: a STATEWORKER_* variable is invalid, or the URL's scheme is not
                redis:// or unix:// (not a StateError: no code).

        Example: `client = StateClient("redis://localhost:6379/0", caller="billing")`
        """
        self.settings = settings or Settings.from_env(redis_url=redis_url)
        # (the bus's Redis: STATEWORKER_BUS_REDIS_URL when set; watches read the state's)
        self.url = bus_url(self.settings)
        check_url(self.url)
        # (`acl` mode: the principal's own stream and reply lists, the URL's Redis user)
        self.stream, replies, self.principal = caller_route(self.settings, self.url, service)
        # (STATEWORKER_BUS_SHARDS > 1: `stream` is shard 0; a call goes to the shard its scope
        # or id picks. The service must read at least as many: `missing_readers` tells.)
        self.shards = caller_shards(self.settings, service, self.stream)
        self._one_stream = self.stream if len(self.shards.streams) == 1 else None  # (no pick)
        self.reply_key = replies + uuid.uuid4().hex
        self.timeout = timeout
        self.retries = retries
        self.caller = caller
        self.conn = connection_for(self.url, write_first_at_once=False,
                                   connect_timeout_s=self.settings.connect_timeout_s,
                                   read_timeout_s=self.settings.read_timeout_s)
        self._pending: dict[str, Waiter] = {}  # the calls waiting for their reply, by id
        self._replies = ReplyReader(self.url, self.settings, self.reply_key, self._pending,
                                    self._met)
        self._readers = [self._replies]  # (on a cluster one a reply list: `_routes`)
        # The bus on a Redis of its own (`off` mode): the replies the calls' scripts answer
        # are published on the state's Redis, one hop sooner (transport/subscriber.py).
        state_url = client_url(self.settings)
        self._published = Subscriber(
            state_url, self.reply_key, self._replies.deliver, self._published_lost,
            connect_timeout_s=self.settings.connect_timeout_s,
            read_timeout_s=self.settings.read_timeout_s) \
            if self.url != state_url and self.principal is None else None
        self._routes: Routes | None = None
        self._stack = AsyncExitStack()
        self._ids = CallIds(principal=self.principal)  # (on a cluster: homed ids, __aenter__)
        # The re-sends' horizon: half the service's dedupe window, once read (bus/resends.py).
        self._stats_key = stats_key(self.settings.prefix, service)
        self.service_window_ms: int | None = None
        self.resend_window_ms = fallback_window_ms(self.settings)
        self._closed = False
        self.transient: Counter[str] = Counter()

    def _met(self, error: BaseException | None) -> None:
        self.transient[transient_reason(error) or "OTHER"] += 1

    async def __aenter__(self) -> StateClient:
        """Connect (PING) and start the reply reader. A Redis that refuses connections or is
        loading its dataset is waited for (with backoff), at most `timeout` seconds.

        Raises:
            Unavailable (UNAVAILABLE): no Redis answered at the URL within `timeout`, or it
                stayed in a transient state (LOADING ...); the message names the URL and
                how to start the service.
            ConfigError: Redis refused the connection for good (e.g. NOAUTH).

        Example: `async with StateClient() as client: ...`
        """
        await open_ready(self.conn, self.timeout, self._met, "the client")
        conn = await probed(self.conn, as_user=False)  # one URL naming a cluster node
        if conn is not self.conn:
            self.conn = conn
            await self._replies.conn.close()
            self._replies.conn = connection_like(conn, write_first_at_once=True)
        if isinstance(conn, ClusterConnection):  # ids bound with their call's record
            self._ids.keys = self.shards.keys
            await self._route(conn)
        await self._learn_window()
        # Deadlines on Redis's clock, as the service's (transport/redis_clock.py); not for a
        # principal (its rule has no TIME: a refusal logged each time).
        reads_clock = self.principal is None and may_read_clock(conn)
        if reads_clock:
            await sync_clock(conn)
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.push_async_callback(self._close)
        for reader in self._readers:
            tg.start_soon(reader.read)
        if self._published is not None:
            tg.start_soon(self._published.run)
            # (the first calls published when it can: the subscription made, or given up)
            with anyio.move_on_after(self.settings.connect_timeout_s or 5.0):
                await self._published.tried.wait()
        tg.start_soon(self._replies.sweep_timeouts)
        tg.start_soon(self._follow_window)
        if reads_clock:
            tg.start_soon(follow_clock, conn, WINDOW_REFRESH_S)
        self._stack.callback(tg.cancel_scope.cancel)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Close: calls still waiting raise Unavailable, the reply list is deleted.

        Args:
            exc_type, exc, tb: the block's exception, if any (not suppressed).

        Raises: nothing of its own (a Redis already gone is ignored).

        Example: the end of `async with StateClient() as client:`
        """
        await self._stack.aclose()

    async def _route(self, conn: ClusterConnection) -> None:
        """On a cluster: a reply list on each node, and a reader for each (bus/routes.py)."""
        if not conn.primaries:
            await conn.refresh()
        routes = self._routes = Routes(conn, self.shards, self.reply_key, self.settings.prefix,
                                       self.settings.partitions)
        await self._replies.conn.close()
        self._published = None  # (a cluster's scripts answer on its nodes' reply lists)
        self.reply_key = routes.lists[0]
        self._readers = [ReplyReader(self.url, self.settings, name, self._pending, self._met,
                                     connection_like(conn, write_first_at_once=True))
                         for name in routes.lists]
        self._replies = self._readers[0]

    def _published_lost(self, exc: BaseException) -> None:
        """The subscription broke: replies published meanwhile are gone. Every waiting call
        sends again (same id and deadline; a re-send is never published) and gets its reply
        on the bus: a write's from its record, a read read again."""
        self._met(exc)
        self._replies.wake_all()

    async def _close(self) -> None:
        self._closed = True
        if self._published is not None:
            self._published.close()
        self._replies.wake_all()  # calls still waiting end now
        with anyio.CancelScope(shield=True):
            # Redis gone or loading: the reply lists expire on their own (so a close never
            # waits long for them, nor fails because of them).
            with anyio.move_on_after(1.0), suppress(ConnectionLost, ReplyError):
                for reader in self._readers:
                    await self.conn.execute("DEL", reader.reply_key)
            await self.conn.close()
            for reader in self._readers:
                await reader.conn.close()

    @property
    def published_replies(self) -> int:
        """How many replies came published on the state's Redis (the bus on a Redis of its
        own, `off` mode: a call's script answers there, one hop sooner than the reply list)."""
        return 0 if self._published is None else self._published.messages

    async def missing_readers(self) -> list[str]:
        """The streams this client may send to that no consumer group reads (XINFO GROUPS of
        each shard): a service not started yet, or one that reads fewer shards than this
        client's STATEWORKER_BUS_SHARDS (its calls to the others would wait unread until a
        service with as many shards starts). A Redis user that may not look (`acl` mode)
        sees none missing.

        Raises:
            ConnectionLost: Redis went away meanwhile.

        Example: `if await client.missing_readers(): ...`
        """
        missing = []
        for stream in self.shards.streams:
            try:
                groups = await self.conn.execute("XINFO", "GROUPS", stream)
            except ReplyError as exc:
                if "no such key" not in str(exc).lower():
                    continue
                groups = []
            if not groups:
                missing.append(stream)
        return missing

    # ---- calls -------------------------------------------------------------------------------
    async def call_json(
        self, fn: str, body: bytes | str, *, timeout: float | None = None,
        call_id: str | None = None, context: Mapping[str, Any] | None = None,
        deadline_ms: int | None = None,
    ) -> bytes:
        """Call `fn` with a JSON body; the result's JSON. Errors raise their StateError.

        The call is sent with its deadline (`deadline_ms`, default now + `timeout`): the
        service starts it only before then, so once this returns TIMEOUT the call is applied
        by its deadline or never. Re-sends (`retries`, and after each transient Redis error,
        with backoff) reuse the id and the deadline.

        Args:
            fn: the function id (`state::get`, `orders::create` ...).
            body: the request as JSON text (a JSON object).
            timeout: the call's overall time in seconds; default the client's `timeout`.
            call_id: the call's unique id; default a new one. Reuse it only to repeat the
                same call: it is applied at most once per id (dedupe window), and a repeat
                gets the first call's recorded reply. One call per id at a time in a client
                (it re-sends a call itself): a second while the first waits is refused.
            context: a JSON object handed to the function (`call.ctx.context`). Called
                under a current OpenTelemetry span, the call has a span of its own (CLIENT)
                and its context carries it (`traceparent`, `tracestate`: tracing.py).
            deadline_ms: epoch ms after which the call must not start anymore; default now +
                `timeout` (pass a TIMEOUT's `details["deadline_ms"]` with its call id to learn
                that call's outcome without applying it anew).

        Raises:
            CallTimeout (TIMEOUT): no reply within `timeout` though the call may have reached
                the stream; the message and `details` (`call_id`, `deadline_ms`) say until
                when it may still be applied.
            Unavailable (UNAVAILABLE): the call never reached the stream within `timeout`
                (Redis refused connections or answered LOADING, BUSY ... throughout: it will
                never be applied; `details["sent"]` is False), the XADD was refused for
                good, or the client is closed (or closed while waiting).
            InvalidRequest (INVALID_REQUEST): `call_id` is already in flight in this client
                (at once; the first call goes on).
            StateError: the error reply, as the class of its code: InvalidRequest
                (INVALID_REQUEST), KeyTooLong (KEY_TOO_LONG), ValueTooLarge
                (VALUE_TOO_LARGE), Conflict (CONFLICT), NotFound (NOT_FOUND), ReservedScope
                (RESERVED_SCOPE), UnknownFunction (UNKNOWN_FUNCTION), DeadlineExceeded
                (DEADLINE_EXCEEDED), CallIdReused (CALL_ID_REUSED), InternalError
                (INTERNAL); RemoteError for a code without a class.

        Example: `await client.call_json("state::get", b'{"scope":"orders","key":"o-1"}')`
        """
        if self._closed:
            raise Unavailable(f"{fn}: the client is closed", {})
        partition = None  # (the body's scope's: its shard, and on a cluster its id's home)
        if self._one_stream is None or self._ids.keys is not None:
            partition = body_partition(self.shards.keys, body)
        call_id = call_id or self._ids.new(partition)
        if tracing.is_traced():  # (a span is current: the call's own, named in its context)
            with tracing.calling(fn, call_id):
                return await self._call(fn, body, timeout, call_id, tracing.inject(context),
                                        deadline_ms, partition)
        return await self._call(fn, body, timeout, call_id, context, deadline_ms, partition)

    async def call(self, fn: str, body: Any, **options: Any) -> Any:
        """Like `call_json`, body and result as Python values (tagged types converted).

        Args:
            fn: the function id.
            body: a JSON-able Python value (Decimal, datetime, UUID, bytes ... are sent
                tagged), or JSON text as str/bytes, sent as is.
            **options: `call_json`'s keyword options (timeout, call_id, context,
                deadline_ms).

        Raises:
            InvalidRequest (INVALID_REQUEST): `body` holds a value that cannot be JSON
                (raised before sending), or the service refused the request.
            StateError, CallTimeout (TIMEOUT), Unavailable (UNAVAILABLE): as `call_json`.

        Example: `await client.call("orders::create", {"id": 7}, call_id="order-7")`
        """
        data = body if isinstance(body, bytes | str) else pyvalues.encode_tree(body)
        return pyvalues.decode_value(await self.call_json(fn, data, **options))

    # ---- watches -----------------------------------------------------------------------------
    def watch(self, scope: str | None = None, key: str | None = None,
              from_revision: str | None = None) -> Watch:
        """The change events of a scope, a key or every scope, in revision order, read
        straight from the partition streams (on a connection of the watch's own; the bus
        and the state service are not involved).

        Yields `Event`s, and a `Bookmark(revision)` after `watch_progress_s` (setting,
        default 5 s) without one: resume from its revision and nothing it passed is read
        again. One scope's events come in their exact order; an unscoped watch merges the
        partitions by revision (events of two partitions can share a revision: those come
        one after another, and a watch resumed from it skips them all). A broken connection,
        a Redis restart or LOADING is waited out and the watch goes on where it was.

        Args:
            scope: only this scope's events; None: every scope's.
            key: only this key's events (in `scope`, or in every scope).
            from_revision: every event with a revision after this one (an event's
                `revision`, a bookmark's), each once; None: only events after the watch
                opened (as etcd does).

        Raises:
            InvalidRequest (INVALID_REQUEST): `from_revision` is not `<ms>-<seq>`, or scope
                or key is not valid UTF-8 text (at once).
            Unavailable (UNAVAILABLE): no Redis answered within the client's `timeout` when
                the watch opened.
            Compacted (COMPACTED): while iterating, when events after `from_revision` (or
                after what the watch had read) were trimmed from the stream before it read
                them, or are in no stream (`from_revision` is from before a restore or a
                flushed Redis, ahead of this Redis, or Redis went back to an older copy
                of its data: `details["reason"]`);
                `details["oldest_kept"]` names the oldest revision kept. Every event
                before them has been handed on; resync (read the state) and watch anew.

        Example:
            `async with client.watch("orders", from_revision=rev) as events:`
            `    async for item in events: print(item)`
        """
        return Watch(client_url(self.settings), self.settings, scope=scope, key=key,
                     from_revision=from_revision, start_timeout_s=self.timeout)
