"""`RedisState`: what every state operation runs with (settings, key names, the connection,
the script library) and how its plans run.

An operation is a function `xxx_plan(state, ...) -> Plan` in writes.py, reads.py, listing.py
or expiry.py: the commands it needs and what to make of their replies (transport/plans.py), so
the bus can run a whole batch of calls as one pipeline. Every mutation is one Lua script call,
built by its binding (scripts/bindings.py). Opening and closing are in lifecycle.py. It also holds
the claims cache (claims.py), the access cache (access.py) and the registry follower that keeps
them current (registry.py).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import msgspec

from stateworker.context import Answer, CallContext
from stateworker.errors import StateError, Unavailable, store_lost_read
from stateworker.keys import (
    HISTORY_GENERATION,
    HISTORY_RESTORING,
    KeySpace,
    PartitionKeys,
    call_field,
)
from stateworker.scripts.bindings import BIND, Call, bind_call, entry_call, library_of
from stateworker.scripts.library import Binding
from stateworker.scripts.statuses import LUA_STATUS, Target, raise_for_status, script_reply
from stateworker.settings import Settings
from stateworker.state.core.access import PRINCIPALS, ROLES, Access
from stateworker.state.core.claims import KIND as CLAIMS
from stateworker.state.core.claims import Claims
from stateworker.state.core.confirm import Confirm
from stateworker.state.core.live import KIND as SETTINGS
from stateworker.state.core.live import LiveSettings
from stateworker.state.core.once import run_once
from stateworker.state.core.registry import Registry
from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.connect import connection_like
from stateworker.transport.connection import RedisConnection
from stateworker.transport.embedded import EmbeddedRedis
from stateworker.transport.plans import (
    ANSWERED,
    REPLIED,
    Answered,
    Plan,
    Sent,
    command_reply,
    execute_many,
    send_first_step,
)
from stateworker.transport.slots import name_slot
from stateworker.transport.wire import Arg

R = TypeVar("R")
_DUPLICATE, _ANSWERED = LUA_STATUS["DUPLICATE"], LUA_STATUS["ANSWERED"]
_UNHEARD = LUA_STATUS["UNHEARD"]


def answered_as(answer: Answer | None) -> Answered:
    """What a plan whose script answered its call gives: ANSWERED, or REPLIED when the
    call's entry is left to the service to acknowledge (its stream on another node)."""
    return ANSWERED if answer is None or answer.stream else REPLIED


def _recorded(record: bytes) -> list[Any]:
    """A recorded script reply (cmsgpack) in the shape Redis returned it: bytes for strings,
    None for false, lists for tables."""
    return list(_plain(msgspec.msgpack.decode(record)))


def _plain(item: Any) -> Any:
    if isinstance(item, str):
        return item.encode()
    if item is False:
        return None
    if isinstance(item, dict):  # an empty Lua table packs as a map
        return [_plain(v) for v in item.values()]
    if isinstance(item, list):
        return [_plain(v) for v in item]
    return item


class RedisState:
    """The state of one Redis server (embedded or external) for one prefix."""

    def __init__(self, settings: Settings, conn: RedisConnection,
                 embedded: EmbeddedRedis | None = None) -> None:
        self.keys = KeySpace(settings.prefix, settings.partitions)
        # The settings in force: those at start with the live overrides (live.py), shared
        # with every copy of this state (the dispatcher's), so a reload reaches them all.
        self.live = LiveSettings(conn, self.keys.live_settings, settings)
        self.conn = conn
        # Where the bus is (call streams, reply lists, trigger targets' streams): this same
        # connection, or with STATEWORKER_BUS_REDIS_URL one to the bus's own Redis
        # (lifecycle.connect), which no script ever touches (`split_bus`).
        self.bus_conn = conn
        self.library = library_of(conn)
        self.embedded = embedded
        # A Redis Cluster (INFO cluster, at start): every script call keeps to one slot, so a
        # bus call's id is bound by the entry script only when its home is the scope's
        # partition (KeySpace.id_home), else in a step of its own.
        self.cluster = False
        # `strict`: what every batch of plans is confirmed with (the AOF fsync where the server
        # has WAITAOF, the replicas that hold it) before any of its results is handed on.
        self.confirm = Confirm()
        # The prefix's meta key was absent at start (check_server wrote it): a new Redis, or
        # one wiped; the repair at start (snapshot/repair.py) reads it.
        self.created = False
        # Why writes are refused, when this Redis lost the data PostgreSQL holds (its
        # generation markers: state/generation.py, whose watch keeps it); None: they are not.
        self.lost: str | None = None
        # Why Redis may evict the service's keys now (lifecycle.eviction_loop), or None
        self.evicting: str | None = None
        # What replicas keep in memory, kept current by the registry follower (lifecycle.py
        # runs it): the claimed scopes of private namespaces.
        self.registry = Registry(conn, self.keys.registry)
        self.claims = Claims(conn, self.keys.claims)
        self.registry.on(CLAIMS, self.claims.reload, self.claims.apply)
        # `acl` mode's principals and roles (access.py), and what each may call.
        self.access = Access(conn, self.keys)
        self.registry.on(PRINCIPALS, self.access.reload, self.access.apply)
        self.registry.on(ROLES, self.access.reload, self.access.apply)
        self.registry.on(SETTINGS, self.live.reload, self.live.apply)

    @property
    def settings(self) -> Settings:
        return self.live.current

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings at start (tests, a restore's): the live overrides apply over them."""
        self.live.base = self.live.current = settings

    @property
    def split_bus(self) -> bool:
        """The bus is on a Redis of its own (STATEWORKER_BUS_REDIS_URL): no script answers
        its call (the service writes every reply), nothing of the bus is written here."""
        return self.settings.bus_redis_url is not None

    async def close(self) -> None:
        await self.conn.close()
        if self.bus_conn is not self.conn:
            await self.bus_conn.close()
        if self.embedded is not None:
            await self.embedded.stop()

    def on_own_connection(self) -> RedisState:
        """This state on a pipelining connection of its own to the same Redis (or cluster),
        all else shared: the trigger dispatcher's, so its reads and writes never wait in the
        bus's pipelines (nor the bus's in its). Close it with `close_own_connection`."""
        twin = copy.copy(self)
        twin.conn = connection_like(self.conn)
        twin.bus_conn = twin.conn if self.bus_conn is self.conn else connection_like(
            self.bus_conn)
        twin.embedded = None  # (the server stays the service's to stop)
        return twin

    async def close_own_connection(self) -> None:
        """Close what `on_own_connection` opened (the server itself is left running)."""
        await self.conn.close()
        if self.bus_conn is not self.conn:
            await self.bus_conn.close()

    # ---- running plans -----------------------------------------------------------------------
    async def execute(self, plan: Plan) -> Any:
        """Run one plan to its result; its StateError is raised."""
        (result,) = await self.execute_many([plan])
        if isinstance(result, StateError):
            raise result
        return result

    async def execute_many(self, plans: Sequence[Plan], sent: Sent = None,
                           done: Callable[[int, Any], None] | None = None,
                           after_step: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
        """Run plans together (one pipeline per step); results or StateErrors, in order.
        `sent`: their first step, already sent with `send_first_step`; see plans.py."""
        if not self.confirm.needed:
            return await execute_many(self.conn, self.library, plans, sent, done, after_step)
        # Results are held until the batch is confirmed: a reply only after the write is on
        # disk (WAITAOF) and on the replicas strict asks for (WAIT).
        results = await execute_many(self.conn, self.library, plans, sent, None, after_step)
        missing = await self.confirm.missing(self.conn)
        if missing is not None:
            lost = Unavailable(missing)
            results = [lost for _ in results]
        for index, result in enumerate(results):
            if done is not None:
                done(index, result)
        return results

    @property
    def waitaof(self) -> bool:
        """`strict` on a Redis with WAITAOF (7.2+): each batch is confirmed fsynced."""
        return self.confirm.waitaof

    @waitaof.setter
    def waitaof(self, value: bool) -> None:
        self.confirm.waitaof = value

    def send_first_step(self, plans: Sequence[Plan]) -> Sent:
        return send_first_step(self.conn, plans)

    # ---- script plans ------------------------------------------------------------------------
    def script_plan(self, binding: Binding[R], call: Call, finish: Callable[[R], Any],
                    target: Target | None = None) -> Plan:
        """One script call (`call`: its KEYS and ARGV, from its builder); `finish` gets its
        typed reply. With a `target`, the statuses that are errors are raised first."""
        def done(replies: list[Any]) -> Any:
            reply = script_reply(replies[0], binding.name)
            if target is not None:
                raise_for_status(reply, target)
            return finish(binding.reply(reply))

        return Plan([binding.command(self.library, *call)], done)

    def read_plan(self, parts: Sequence[PartitionKeys], commands: list[list[Arg]],
                  finish: Callable[[list[Any]], Any]) -> Plan:
        """A read that runs no script (a GET, a ZRANGE ...) of the partitions `parts`, refused
        where one does not hold its data whole, as the read scripts refuse (STORE_LOST:
        generation.lua `generation_read_refused`): a key a lost or half restored Redis lacks
        is not known to be missing. Each partition's marker is read after the commands, in
        the same step and slot: they read a whole dataset unless a restore ended between two
        commands of one pipeline (a wipe between them is refused; a restore's many steps,
        its stamp last, cannot all fit there). `finish` gets the commands' replies."""
        count, prefix = len(commands), self.keys.prefix
        checks: list[list[Arg]] = [["HMGET", part.history, HISTORY_GENERATION,
                                    HISTORY_RESTORING] for part in parts]

        def checked(replies: list[Any]) -> Any:
            for reply in replies[count:]:
                marker = command_reply(reply, "HMGET")
                if marker[0] is None:
                    raise store_lost_read(prefix, marker[1] is not None)
            return finish(replies[:count])

        return Plan([*commands, *checks], checked)

    def registry_read_plan(self, commands: list[list[Arg]],
                           finish: Callable[[list[Any]], Any]) -> Plan:
        """A read of the registry's hashes (triggers, claims, principals, roles), refused as
        `read_plan` refuses a partition's (generation.lua `generation_registry_lost`) where
        the registry's marker is gone or held by a restore ("~" ...): a registration or a
        principal PostgreSQL holds is not answered as none. One GET more, in the same
        pipeline and slot (the marker shares the registry's hash tag)."""
        count = len(commands)

        def checked(replies: list[Any]) -> Any:
            marker = command_reply(replies[count], "GET")
            if marker is None or marker.startswith(b"~"):
                raise store_lost_read(self.keys.prefix, marker is not None)
            return finish(replies[:count])

        return Plan([*commands, ["GET", self.keys.registry_marker]], checked)

    def entry_plan(self, binding: Binding[R], target: Target, args: Sequence[Arg],
                   finish: Callable[[R], Any],
                   accept: frozenset[int] = frozenset(), answers: bool = False) -> Plan:
        """An entry script (bindings.entry_call; `args` its own ARGV, from its `<name>_args`
        builder). A bus call's reply is recorded with the change; a second delivery gets the
        recorded reply. Statuses that are errors are raised (statuses.STATUS_ERRORS) unless
        `accept`ed; `finish` gets the rest, typed (the binding's reply tuple). `answers`: the
        script can write the call's reply itself, which it does when the call carries a
        context.Answer (the plan's result is then plans.ANSWERED)."""
        scope, key, ctx = target.scope, target.key, target.ctx
        answer = self.answer_here(ctx.answer, scope) if answers else None
        answered = answered_as(answer)

        def replayed(replies: list[Any]) -> Any:
            reply = script_reply(replies[0], binding.name)
            if reply[0] == _ANSWERED:
                return answered
            if reply[0] == _UNHEARD:  # (published to no one: the service answers, on the bus)
                return msgspec.Raw(reply[1])
            if reply[0] == _DUPLICATE:
                reply = _recorded(reply[1])
            raise_for_status(reply, target, accept)
            return finish(binding.reply(reply))

        binds = ctx.call_id is not None and (not self.cluster or self.id_at_home(ctx, scope))
        command = binding.command(self.library, *entry_call(
            self.settings, self.keys, scope, key, ctx, self.cluster, args, answer))
        return Plan([command], replayed, checks_deadline=True, binds_call_id=binds)

    def answer_here(self, answer: Answer | None, scope: str) -> Answer | None:
        """Whether a bus call's script may write its reply (context.Answer): on one Redis
        always; on a cluster when the map puts its reply list on the node of the scope's
        partition (the stream too, else the service acknowledges the entry: stream ""). The
        script checks again (`check`), as the map may be stale. None: the service answers."""
        if answer is None:
            return None
        if self.split_bus:
            return msgspec.structs.replace(answer, stream="") if answer.publish else None
        if answer.publish:  # (asked where the bus is not on a Redis of its own: a list's)
            answer = msgspec.structs.replace(answer, publish=False)
        if not self.cluster:
            return answer
        conn = self.conn
        if not isinstance(conn, ClusterConnection):
            return None
        node = conn.owner(name_slot(self.keys.for_scope(scope).tag))
        if node is None or conn.owner(name_slot(answer.reply)) != node:
            return None
        stream = answer.stream if conn.owner(name_slot(answer.stream)) == node else ""
        return msgspec.structs.replace(answer, stream=stream, check=True)

    def id_at_home(self, ctx: CallContext, scope: str) -> bool:
        """On a cluster: whether the call's id is bound in `scope`'s partition (its home,
        KeySpace.id_home), so the entry script's record binds it in the same slot."""
        keys = self.keys
        return keys.id_home(call_field(ctx.call_id or "")) == keys.partition_of(scope)

    def claimed(self, ctx: CallContext, plan: Plan, read_only: bool) -> Plan:
        """`plan`, run only if its call id is free or already bound to this same call.

        A record in one partition would not meet an id reused for a call in ANOTHER partition. So
        every bus call binds its id to its digest (function + body) where its id is bound
        (KeySpace.binding: its bucket of records; on a cluster its home partition's records;
        bind.lua, kept as long as the records). The entry scripts record there themselves
        when that is where they record (`binds_call_id`: their record is the binding; on a
        cluster when the id's home is the scope's partition); a read binds it in the same
        pipeline, before its own commands (what it read is dropped when the id is another
        call's); any other call binds it in a step before it runs, so a refused call never
        writes. The calls of one batch keep their order either way (a
        read does not overtake a write read before it).
        """
        if not read_only and not plan.checks_deadline:
            # (a write whose steps record nothing: claimed, and its reply kept, state/core/
            # once.py; an entry script records its call itself, on a cluster in its partition)
            return run_once(self.settings, self.keys, self.library, ctx, self.cluster, plan)
        claim = BIND.command(self.library, *bind_call(self.settings, self.keys, ctx,
                                                      self.cluster, "r" if read_only else "b"))

        def check(reply: Any) -> None:
            raise_for_status(script_reply(reply, BIND.name), Target(self.settings, "", "", ctx))

        if read_only:
            def read(replies: list[Any]) -> Any:
                check(replies[0])
                return plan.finish(replies[1:])

            return Plan([claim, *plan.commands], read, plan.checks_deadline)

        def bound(replies: list[Any]) -> Plan:
            check(replies[0])
            return plan

        return Plan([claim], bound, plan.checks_deadline)

    def target(self, scope: str, key: str, ctx: CallContext, *,
               expected_version: int | None = None, create_only: bool = False) -> Target:
        return Target(self.settings, scope, key, ctx, expected_version, create_only)
