"""The state service: the `state::*` functions on the bus. Lifecycle only: start in order
(PostgreSQL connected and migrated when `postgres_url` is set; Redis opened once, its checks
and scripts; the repair at start on that state and that PostgreSQL connection; the registry
follower, the TTL reaper, the bus, the trigger dispatcher, the snapshot), run the loops in
one task group, drain on stop.

A Redis that is loading its dataset (or BUSY ...) at start is waited for, at most
`START_WAIT_S`; one that refuses connections is reported at once (a wrong URL should not
make `serve` hang). Once serving, Redis going away or loading never stops the service: the
bus loops back off and go on (bus/runtime.py), the reaper retries its next round."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from stateworker.app import service_user
from stateworker.app.http import serve_http
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.bus.runtime import BusRuntime
from stateworker.bus.sources import Sources
from stateworker.engines.catalog import CATALOG
from stateworker.errors import StateError
from stateworker.keys import STATE_SERVICE
from stateworker.reactive.dispatcher import Dispatcher
from stateworker.schemas import encoder
from stateworker.settings import Settings
from stateworker.snapshot.repair import repair_at_start
from stateworker.snapshot.snapshotter import Snapshotter, prepare
from stateworker.snapshot.tables import PgConnection
from stateworker.state import functions, layout, lifecycle
from stateworker.state.core.store import RedisState
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connection import RedisConnection, shown_url
from stateworker.transport.plans import Answered, Plan, Sent
from stateworker.transport.retry import wait_ready
from stateworker.transport.wire import ConnectionLost, ReplyError

START_WAIT_S = 60.0  # how long a start waits for a Redis that is loading its dataset

log = logging.getLogger("stateworker.service")


class StateCalls:
    """The state functions as plans for the bus (a whole batch runs as one pipeline)."""

    def __init__(self, state: RedisState) -> None:
        self.state = state

    def prepare(self, call: Call) -> Plan:
        return functions.prepare(self.state, call.fn, call.body, call.ctx, CATALOG)

    @property
    def answers_in_script(self) -> frozenset[str]:
        """The functions whose script answers its call itself where the reply list shares the
        node with the state (always on one Redis; on a cluster: RedisState.answer_here);
        none when a strict batch waits for a confirmation (WAITAOF, WAIT) before its
        replies."""
        if self.state.confirm.needed:
            return frozenset()
        return functions.ANSWERED_IN_SCRIPT

    def send(self, plans: Sequence[Plan]) -> Sent:
        return self.state.send_first_step(plans)

    async def execute_many(self, plans: Sequence[Plan], sent: Sent,
                           done: Callable[[int, Any], None],
                           after_step: Callable[[], Awaitable[None]]) -> list[Any]:
        """Results are encoded as JSON here, as each plan ends."""
        def encoded(index: int, result: Any) -> None:
            done(index, result if isinstance(result, StateError | Answered)
                 else encoder.encode(result))

        return await self.state.execute_many(plans, sent, encoded, after_step)


class StateService:
    """`async with StateService.running(settings) as service:` serves until the block ends,
    then stops intake and answers every call already read."""

    def __init__(self, state: RedisState, options: BusOptions,
                 pg: PgConnection | None = None) -> None:
        """`pg`: the start's PostgreSQL connection (`prepare`'s), the snapshotter's to keep."""
        self.state = state
        self.bus = Bus(state.settings.prefix, STATE_SERVICE, state.settings.bus_shards)
        # The one start line says what a reply promises (durability and how it is kept).
        durability = {"durability": state.settings.durability,
                      "fsync": lifecycle.fsync_guard(state)}
        # On a Redis Cluster it says which seed answered (a seed down or a replica is skipped).
        conn = state.conn
        cluster = ({"cluster_seed": conn.answered or "", "primaries": str(len(conn.primaries))}
                   if isinstance(conn, ClusterConnection) else {})
        # (STATEWORKER_BUS_REDIS_URL: the streams, replies and acks on the bus's own Redis;
        # the plans still run on the state's, StateCalls)
        bus = {"bus_redis": state.bus_conn.shown} if state.split_bus else {}
        self.runtime = BusRuntime(state.bus_conn, self.bus, options, batch=StateCalls(state),
                                  describe={**durability, "auth": state.settings.auth, **cluster,
                                            **bus},
                                  sources=_sources(state, self.bus), functions=CATALOG.functions,
                                  dedupe_window_ms=state.settings.dedupe_window_ms)
        self.dispatcher = Dispatcher(state) if state.settings.dispatch else None
        url = state.settings.postgres_url
        # The repair at start left to the snapshotter only when PostgreSQL was away then
        # (`pg` None): a Redis wiped later, under a running service, is the operator's to
        # restore (writes refused until `stateworker restore`), as decision 0037 says.
        self.snapshotter = Snapshotter(state, url, pg, decide=None if pg else repair_at_start) \
            if url else None
        # The HTTP face (settings.http; app/http.py): where it listens once started.
        self.http_address: str | None = None
        self.http_stop = anyio.Event()

    @classmethod
    @asynccontextmanager
    async def running(cls, settings: Settings, options: BusOptions | None = None
                      ) -> AsyncIterator[StateService]:
        # One start: PostgreSQL connected and migrated once (the repair reads it, then the
        # snapshotter keeps it); Redis opened once, waited for on the state's own connection,
        # checked and repaired before the registry follower loads from it; then every loop,
        # each started (`task_status`) before the next, so a failed start is raised here.
        settings.check_serving()
        pg = await prepare(settings)
        started = False
        try:
            ready = _ready(settings) if settings.redis_url is not None else None
            state = await lifecycle.connect(settings, ready)
            try:
                await lifecycle.check_bus(state)
                if state.split_bus and settings.bus_redis_url is not None:
                    # The same rule on the bus's Redis: its user is checked as the state's
                    # (a NOPERM at a rare moment there would leave calls pending for ever).
                    await service_user.check(state.bus_conn, settings)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await state.close()
                raise
            state.access.serve(CATALOG.specs)  # (the engines' functions: the roles' families)
            async with lifecycle.running(state, reaper=True,
                                         before=lambda opened: repair_at_start(opened, pg)):
                service = cls(state, options or BusOptions(), pg)
                # Its shared settings held and checked against the live services' and
                # where the bus was (state/layout.py), before it serves or hands on.
                async with layout.serving(state, service.runtime.consumer), \
                        anyio.create_task_group() as tg:
                    await tg.start(service.runtime.run)
                    if service.dispatcher is not None:
                        await tg.start(service.dispatcher.run)
                    if service.snapshotter is not None:
                        await tg.start(service.snapshotter.run)
                    if settings.http is not None:
                        service.http_address = await tg.start(
                            serve_http, state, service.runtime, settings.http, service.http_stop)
                    try:
                        started = True
                        yield service
                    finally:
                        service.runtime.stop()
                        if service.dispatcher is not None:
                            service.dispatcher.stop()
                        if service.snapshotter is not None:
                            service.snapshotter.stop()
                        service.http_stop.set()
        except BaseException as exc:
            # A permission the start met refused (one the check cannot ask of Redis ahead,
            # or a rule changed under it): the one line that names it, not a traceback.
            missing = None if started else service_user.missing_from(
                exc, settings, shown_url(settings.redis_url or ""))
            if missing is not None:
                raise missing from None
            raise
        finally:
            if pg is not None:  # (closed by the snapshotter already, unless it never ran)
                with anyio.CancelScope(shield=True):
                    await pg.close()


def _ready(settings: Settings) -> Callable[[RedisConnection], Awaitable[None]]:
    """What runs first on the state's connection to an external Redis: the wait while it
    loads, then the check that the service's user has the whole ACL rule."""
    async def ready(conn: RedisConnection) -> None:
        await _wait_while_loading(conn)
        await service_user.check(conn, settings, publishes=settings.bus_redis_url is not None)

    return ready


def _sources(state: RedisState, bus: Bus) -> Sources:
    """The streams the state service reads: its own, and in `acl` mode every principal's
    (the roles cache names them; its own stream is closed then: bus/sources.py)."""
    if state.settings.auth != "acl":
        return Sources(bus.prefix, bus.service, bus.streams)
    return Sources(bus.prefix, bus.service, bus.streams, state.access.principals)


async def _wait_while_loading(conn: RedisConnection) -> None:
    """Wait (backoff, at most START_WAIT_S) while Redis answers LOADING, BUSY ... on the
    state's connection; anything else, a refused connection included, is left to the checks
    that follow to report."""
    told = False

    def waiting(error: BaseException) -> None:
        nonlocal told
        if isinstance(error, ConnectionLost):
            raise error  # not one to wait for: the checks report it at once
        if not told:
            told = True
            log.warning("Redis at %s is not serving yet (%s); waiting for it, at most %g s",
                        conn.shown, error, START_WAIT_S,
                        extra={"event": "service.waiting", "redis": conn.shown})

    with contextlib.suppress(ConnectionLost, ReplyError):  # the checks report these
        await wait_ready(conn, START_WAIT_S, waiting)


async def serve(settings: Settings, options: BusOptions | None = None,
                ready: Callable[[StateService], None] | None = None) -> None:
    """Run the state service until SIGINT or SIGTERM; `ready(service)` once it serves."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with StateService.running(settings, options) as service:
            if ready is not None:
                ready(service)
            async for _ in signals:
                break
