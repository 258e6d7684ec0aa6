"""The state operations over Redis; no knowledge of the bus.

Every operation is a `Plan` (plans.py): the commands it needs and what to make of their
replies, so the bus can run a whole batch of calls as one pipeline. Every mutation is one Lua
script call. Arguments arrive validated (`validate.py`); values arrive as `codec.Value`
(compact JSON + hash) and leave as `msgspec.Raw`, so no value is decoded on the way through.
Reads of one key are plain HMGETs checked against the clock here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec

from stateworker import codec
from stateworker.clock import now_ms
from stateworker.context import NO_CONTEXT, CallContext
from stateworker.errors import (
    LUA_STATUS,
    CallIdReused,
    ConfigError,
    Conflict,
    DeadlineExceeded,
    InternalError,
    StateError,
    ValueTooLarge,
)
from stateworker.keys import KeySpace, member
from stateworker.settings import Settings
from stateworker.state import expiry
from stateworker.state.reads import ReadPlans
from stateworker.state.schemas import NULL, DiffResult, EntryResult, SetResult, SwapResult
from stateworker.transport.connection import Arg, ConnectionLost, RedisConnection, ReplyError
from stateworker.transport.embedded import EmbeddedRedis
from stateworker.transport.library import Scripts
from stateworker.transport.plans import (
    Plan,
    Sent,
    execute_many,
    script_reply,
    send_first_step,
    then,
)

log = logging.getLogger("stateworker.state.store")


def _recorded(record: bytes) -> list[Any]:
    """A recorded script reply (cmsgpack) in the shape Redis returned it: bytes for strings,
    None for false, lists for tables."""
    def plain(item: Any) -> Any:
        if isinstance(item, str):
            return item.encode()
        if item is False:
            return None
        if isinstance(item, dict):  # an empty Lua table packs as a map
            return [plain(v) for v in item.values()]
        if isinstance(item, list):
            return [plain(v) for v in item]
        return item

    return list(plain(msgspec.msgpack.decode(record)))


def _deadline_exceeded(deadline_ms: int | None) -> DeadlineExceeded:
    return DeadlineExceeded(f"deadline_ms {deadline_ms} passed before the call ran; nothing "
                            "was written", {"deadline_ms": deadline_ms})


class _Keep:
    """A write keeps the entry's current topic / expiry (compare-and-set, diff)."""


KEEP = _Keep()


def _opt(text: str | None) -> str:
    """Optional string for a script argument: "" for None, else "=" + text."""
    return "" if text is None else "=" + text


class RedisState(ReadPlans):
    """The state operations over one Redis server (embedded or external), values as JSON text."""

    def __init__(
        self, settings: Settings, conn: RedisConnection, embedded: EmbeddedRedis | None = None
    ) -> None:
        self.settings = settings
        self.keys = KeySpace(settings.prefix, settings.partitions)
        self.conn = conn
        self.scripts = Scripts(conn)
        self.embedded = embedded

    # ---- lifecycle ---------------------------------------------------------------------------
    @classmethod
    async def connect(cls, settings: Settings) -> RedisState:
        """Start (or adopt) the embedded Redis when no URL is set, check it, load the scripts."""
        embedded = None
        url = settings.redis_url
        if url is None:
            embedded = EmbeddedRedis(Path(settings.state_dir), settings.appendfsync)
            await embedded.start()
            url = embedded.url
        store = cls(settings, RedisConnection(url), embedded)
        try:
            await store._check_server()
            await store.scripts.load_all()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store.close()
            raise
        return store

    @classmethod
    @asynccontextmanager
    async def open(
        cls, redis_url: str | None = None, *, reaper: bool = True, **overrides: Any
    ) -> AsyncIterator[RedisState]:
        """Open a store (settings from the environment, overridden by keywords) with its reaper.

        With no Redis URL (argument or STATEWORKER_REDIS_URL) an embedded redis-server is
        started under `state_dir` and stopped again when the block ends.
        """
        settings = overrides.pop("settings", None) or Settings.from_env(
            redis_url=redis_url, **overrides
        )
        store = await cls.connect(settings)
        try:
            async with anyio.create_task_group() as tg:
                if reaper:
                    await tg.start(expiry.reaper_loop, store)
                try:
                    yield store
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The caller's own error comes out of the block as itself, not wrapped in a group.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()

    async def close(self) -> None:
        await self.conn.close()
        if self.embedded is not None:
            await self.embedded.stop()

    async def _check_server(self) -> None:
        try:
            info = await self.conn.execute("INFO", "persistence")
        except (ConnectionLost, ReplyError) as exc:
            raise ConfigError(f"Redis at {self.conn.url} is not usable: {exc}") from exc
        aof_on = b"aof_enabled:1" in info
        if not aof_on and not self.settings.allow_no_aof:
            raise ConfigError(
                f"Redis at {self.conn.url} has AOF off (appendonly no): acknowledged writes "
                "could be lost. Turn it on (CONFIG SET appendonly yes) or set "
                "STATEWORKER_ALLOW_NO_AOF=true to accept that risk."
            )
        stored = await self.conn.execute("HGET", self.keys.meta, "partitions")
        if stored is None:
            await self.conn.execute("HSETNX", self.keys.meta, "partitions", self.keys.partitions)
        elif int(stored) != self.keys.partitions:
            raise ConfigError(
                f"prefix {self.settings.prefix!r} was created with {int(stored)} partitions, "
                f"not {self.keys.partitions}: scopes would land in other partitions"
            )

    # ---- running plans -----------------------------------------------------------------------
    async def execute(self, plan: Plan) -> Any:
        """Run one plan to its result; its StateError is raised."""
        (result,) = await execute_many(self.conn, self.scripts, [plan])
        if isinstance(result, StateError):
            raise result
        return result

    async def execute_many(self, plans: Sequence[Plan], sent: Sent = None,
                           done: Callable[[int, Any], None] | None = None,
                           after_step: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
        """Run plans together (one pipeline per step); results or StateErrors, in order.
        `sent`: their first step, already sent with `send_first_step`; see plans.py."""
        return await execute_many(self.conn, self.scripts, plans, sent, done, after_step)

    def send_first_step(self, plans: Sequence[Plan]) -> Sent:
        return send_first_step(self.conn, plans)

    async def run_script(self, name: str, keys: Sequence[Arg], args: Sequence[Arg]) -> list[Any]:
        reply: list[Any] = await self.execute(self.script_plan(name, keys, args, list))
        return reply

    def script_plan(self, name: str, keys: Sequence[Arg], args: Sequence[Arg],
                    finish: Callable[[list[Any]], Any]) -> Plan:
        """One script call; `finish` gets its checked reply."""
        script = self.scripts[name]
        return Plan([script.command(keys, args)],
                    lambda replies: finish(script_reply(replies[0], name)))

    def _entry_plan(self, name: str, scope: str, key: str, ctx: CallContext,
                    args: Sequence[Arg], finish: Callable[[list[Any]], Any]) -> Plan:
        """An entry script (KEYS and first ARGV as documented in set.lua). A bus call's reply
        is recorded with the change; a second delivery gets the recorded reply."""
        part, entry_member = self.keys.for_scope(scope), member(scope, key)
        keys = part.entry_keys(scope, key)
        if ctx.call_id is not None:
            keys.append(part.call_record(ctx.call_id))

        def replayed(replies: list[Any]) -> Any:
            reply = script_reply(replies[0], name)
            if reply[0] == LUA_STATUS["DUPLICATE"]:
                reply = _recorded(reply[1])
            if reply[0] == LUA_STATUS["DEADLINE_EXCEEDED"]:
                raise _deadline_exceeded(ctx.deadline_ms)
            if reply[0] == LUA_STATUS["CALL_ID_REUSED"]:
                raise CallIdReused(
                    f"id {ctx.call_id!r} was used for another call (another function or body) "
                    f"in the last {self.settings.dedupe_window_ms // 1000} s; a retry must "
                    "repeat the same call, a new call needs a new id", {"id": ctx.call_id})
            return finish(reply)

        record = ""  # nothing to record and no deadline: an in-process call
        if ctx.call_id is not None or ctx.deadline_ms is not None:
            deadline = "" if ctx.deadline_ms is None else ctx.deadline_ms
            record = f"{self.settings.dedupe_window_ms}|{deadline}|{ctx.call_digest or '0' * 40}"
        command = self.scripts[name].command(keys, [
            scope, key, entry_member, now_ms(), self.settings.events_maxlen, ctx.by or "",
            record, *args])
        return Plan([command], replayed, checks_deadline=True)

    # ---- writes ----------------------------------------------------------------------------
    def write_plan(
        self,
        scope: str,
        key: str,
        value: codec.Value,
        finish: Callable[[list[Any]], Any],
        *,
        topic: str | _Keep | None = None,
        ttl_ms: int | _Keep | None = None,
        condition: str = "",
        diff: bool = False,
        ctx: CallContext = NO_CONTEXT,
    ) -> Plan:
        """set.lua; `finish` gets its reply (status first). See the script for `condition`.
        A stored hash left unknown by an update is computed, stored and the write repeated."""
        topic_arg = "~" if isinstance(topic, _Keep) else _opt(topic)
        ttl_arg = "" if isinstance(ttl_ms, _Keep) else ttl_ms or 0
        args: list[Arg] = [value.json, value.hash, topic_arg, ttl_arg, condition,
                           "1" if diff else "", "1" if value.plain_strings else ""]

        def attempt(left: int) -> Plan:
            def check(reply: list[Any]) -> Any:
                if reply[0] != LUA_STATUS["NEEDS_HASH"]:
                    return finish(reply)
                if left == 0:
                    raise InternalError(f"the hash of key {key!r} in scope {scope!r} kept "
                                        "changing")
                return then(self.hash_plan(scope, key, reply[1], reply[2]),
                            lambda _digest: attempt(left - 1))

            return self._entry_plan("set", scope, key, ctx, args, check)

        return attempt(3)

    def hash_plan(self, scope: str, key: str, version: int, value: bytes) -> Plan:
        """Compute the hash an update left unknown, store it if the version still holds."""
        digest = codec.hash_tree(codec.decode_exact(value))
        entry = self.keys.for_scope(scope).entry(scope, key)
        return self.script_plan("sethash", [entry], [version, digest], lambda _reply: digest)

    def _conflict(self, scope: str, key: str, expected: int, current: int) -> Conflict:
        return Conflict(
            f"expected_version {expected} does not match current version {current} "
            f"of key {key!r} in scope {scope!r}",
            {"expected_version": expected, "current_version": current},
        )

    def set_plan(
        self,
        scope: str,
        key: str,
        value: codec.Value,
        *,
        topic: str | None = None,
        ttl_ms: int | None = None,
        expected_version: int | None = None,
        create_only: bool = False,
        ctx: CallContext = NO_CONTEXT,
    ) -> Plan:
        expected = 0 if create_only else expected_version

        def finish(reply: list[Any]) -> SetResult:
            if reply[0] == LUA_STATUS["CONFLICT"]:
                raise self._conflict(scope, key, expected or 0, reply[1])
            old = NULL if reply[1] is None else msgspec.Raw(reply[1])
            return SetResult(old, msgspec.Raw(value.json), reply[2], value.hash, reply[3] == 1)

        return self.write_plan(scope, key, value, finish, topic=topic, ttl_ms=ttl_ms,
                               condition="" if expected is None else f"v{expected}", ctx=ctx)

    def compare_and_set_plan(self, scope: str, key: str, expected: codec.Value | None,
                             value: codec.Value, *, ctx: CallContext = NO_CONTEXT) -> Plan:
        """Swap when the stored value deep-equals `expected` (None or null: absent); the
        entry keeps its topic and expiry."""
        def finish(reply: list[Any]) -> SwapResult:
            if reply[0] == 0:
                return SwapResult(True)
            return SwapResult(False, NULL if reply[2] is None else msgspec.Raw(reply[2]))

        condition = "a" if expected is None or expected.json == b"null" else "h" + expected.hash
        return self.write_plan(scope, key, value, finish, topic=KEEP, ttl_ms=KEEP,
                               condition=condition, ctx=ctx)

    def diff_plan(self, scope: str, key: str, value: codec.Value, *, update: bool = True,
                  expected_version: int | None = None, ctx: CallContext = NO_CONTEXT) -> Plan:
        """Compare with the stored value by hash; write (keeping topic and expiry) only when
        it changed."""
        if not update:
            def compare(entry: EntryResult) -> DiffResult:
                if not entry.found:
                    return DiffResult(changed=True, found_previous=False)
                assert isinstance(entry.version, int) and isinstance(entry.hash, str)
                return DiffResult(changed=entry.hash != value.hash, found_previous=True,
                                  previous_version=entry.version, previous=entry.value)

            return then(self.get_entry_plan(scope, key), compare)

        def finish(reply: list[Any]) -> DiffResult:
            status = reply[0]
            if status == LUA_STATUS["CONFLICT"]:
                raise self._conflict(scope, key, expected_version or 0, reply[1])
            if status == LUA_STATUS["UNCHANGED"]:
                return DiffResult(changed=False, found_previous=True, previous_version=reply[1],
                                  previous=msgspec.Raw(reply[2]), version=reply[1],
                                  hash=value.hash)
            found = reply[3] == 0
            return DiffResult(
                changed=True, found_previous=found,
                previous_version=reply[2] - 1 if found else msgspec.UNSET,
                previous=msgspec.Raw(reply[1]) if found else msgspec.UNSET,
                version=reply[2], hash=value.hash,
            )

        return self.write_plan(scope, key, value, finish, topic=KEEP, ttl_ms=KEEP, diff=True,
                               condition="" if expected_version is None else f"v{expected_version}",
                               ctx=ctx)

    def update_plan(
        self,
        scope: str,
        key: str,
        op_args: Sequence[Arg],
        finish: Callable[[list[Any]], Any],
        *,
        ttl_ms: int | None = None,
        expected_version: int | None = None,
        topic: str | msgspec.UnsetType | None = msgspec.UNSET,
        ctx: CallContext = NO_CONTEXT,
    ) -> Plan:
        """update.lua with encoded ops (ops.encode_ops); `finish` gets its OK reply."""
        topic_arg = "" if topic is msgspec.UNSET else ("-" if topic is None else "=" + topic)

        def check(reply: list[Any]) -> Any:
            if reply[0] == LUA_STATUS["CONFLICT"]:
                raise self._conflict(scope, key, expected_version or 0, reply[1])
            if reply[0] == LUA_STATUS["VALUE_TOO_LARGE"]:
                limit = self.settings.max_value_bytes
                raise ValueTooLarge(
                    f"the updated value of key {key!r} would be {reply[1]} bytes of JSON, more "
                    f"than the limit of {limit} bytes; nothing was written",
                    {"path": "$.ops", "size": reply[1], "limit": limit})
            return finish(reply)

        return self._entry_plan("update", scope, key, ctx, [
            self.settings.max_value_bytes,
            "" if expected_version is None else expected_version,
            topic_arg, "" if ttl_ms is None else ttl_ms, *op_args], check)

    def update_topic_plan(self, scope: str, key: str, topic: str | None,
                          *, ctx: CallContext = NO_CONTEXT) -> Plan:
        return self._entry_plan("topic", scope, key, ctx, ["-" if topic is None else "=" + topic],
                                lambda reply: bool(reply[1]))

    def delete_plan(self, scope: str, key: str, *, ctx: CallContext = NO_CONTEXT) -> Plan:
        return self._entry_plan("delete", scope, key, ctx, [],
                                lambda reply: NULL if reply[1] is None else msgspec.Raw(reply[1]))
