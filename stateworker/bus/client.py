"""`StateClient`: calls functions over the bus. One reply list per client, read by one task
that hands each reply to the call waiting for its id; a retry reuses the call's id, so the
service applies it at most once and answers it the same way."""

from __future__ import annotations

import asyncio
import builtins
import itertools
import time
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import msgspec

from stateworker import codec
from stateworker.errors import CallTimeout, ConfigError, Unavailable, error_from
from stateworker.settings import Settings
from stateworker.transport.connection import Arg, ConnectionLost, RedisConnection
from stateworker.transport.embedded import socket_url

ABSENT: Any = msgspec.UNSET
SWEEP_INTERVAL_S = 0.05  # resolution of call timeouts


class _Reply(msgspec.Struct):
    id: str | None
    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: dict[str, Any] = msgspec.field(default_factory=dict)


class _Waiter:
    """One call waiting for its reply. A bare asyncio future (as in redisconn.py): an anyio
    Event and cancel scope per call cost more than the rest of the client's work for it."""

    __slots__ = ("deadline", "error", "future", "reply")

    def __init__(self) -> None:
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.reply: _Reply | None = None
        self.error: BaseException | None = None  # the XADD failed
        self.deadline = 0.0  # time.monotonic(); the sweeper wakes the call after it

    def wake(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def sent(self, xadd: asyncio.Future[list[Any]]) -> None:
        """Done-callback of the XADD: a failure wakes the call with it."""
        if xadd.cancelled():
            self.error = Unavailable("the call was not sent", {})
        elif xadd.exception() is not None:
            self.error = xadd.exception()
        elif isinstance(xadd.result()[0], Exception):  # a Redis error reply to the XADD
            self.error = xadd.result()[0]
        else:
            return
        self.wake()


_reply_decoder = msgspec.json.Decoder(_Reply)


class StateClient:
    """`async with StateClient() as client: await client.set("s", "k", 1)`"""

    def __init__(self, redis_url: str | None = None, *, service: str = "state",
                 timeout: float = 10.0, retries: int = 2, caller: str | None = None,
                 settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env(redis_url=redis_url)
        self.url = self.settings.redis_url or socket_url(Path(self.settings.state_dir))
        self.stream = f"{self.settings.prefix}:bus:{service}"
        self.reply_key = f"{self.settings.prefix}:reply:{uuid.uuid4().hex}"
        self.timeout = timeout
        self.retries = retries
        self.caller = caller
        self.conn = RedisConnection(self.url, write_first_at_once=False)
        self._reader = RedisConnection(self.url)
        self._pending: dict[str, _Waiter] = {}
        self._stack = AsyncExitStack()
        self._ids = itertools.count()
        self._closed = False
        self._id_prefix = uuid.uuid4().hex[:16]

    async def __aenter__(self) -> StateClient:
        try:
            await self.conn.execute("PING")
        except ConnectionLost as exc:
            raise ConfigError(f"no Redis at {self.url}: is the service running? ({exc})") from exc
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.push_async_callback(self._close)
        tg.start_soon(self._read_replies)
        tg.start_soon(self._sweep_timeouts)
        self._stack.callback(tg.cancel_scope.cancel)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._stack.aclose()

    async def _close(self) -> None:
        self._closed = True
        for waiter in list(self._pending.values()):  # calls still waiting end now
            waiter.wake()
        with anyio.CancelScope(shield=True):
            with suppress(ConnectionLost):  # Redis gone: the reply list expires on its own
                await self.conn.execute("DEL", self.reply_key)
            await self.conn.close()
            await self._reader.close()

    async def _read_replies(self) -> None:
        while True:
            try:
                # BLMPOP takes every reply waiting (a service writes a batch's replies in one
                # LPUSH), so the calls they wake send their next requests together.
                popped = await self._reader.execute("BLMPOP", 1, 1, self.reply_key, "LEFT",
                                                    "COUNT", 1000)
            except ConnectionLost:
                await anyio.sleep(0.1)  # back off; the connection reconnects on the next call
                continue
            for document in popped[1] if popped else []:
                self._deliver(document)

    async def _sweep_timeouts(self) -> None:
        """Wake the calls whose time is up. One sweeper instead of a cancel scope per call:
        a call's own timeout would cost more than the call's Redis work."""
        while True:
            await anyio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            for waiter in list(self._pending.values()):
                if waiter.deadline <= now:
                    waiter.wake()

    def _deliver(self, document: bytes) -> None:
        try:
            reply = _reply_decoder.decode(document)
        except msgspec.DecodeError:
            return
        waiter = self._pending.get(reply.id or "")
        if waiter is not None and waiter.reply is None:
            waiter.reply = reply
            waiter.wake()

    # ---- calls -------------------------------------------------------------------------------
    async def call_json(
        self, fn: str, body: bytes | str, *, timeout: float | None = None,
        call_id: str | None = None, context: Mapping[str, Any] | None = None,
        deadline_ms: int | None = None,
    ) -> bytes:
        """Call `fn` with a JSON body; the result's JSON. Errors raise their StateError."""
        if self._closed:
            raise Unavailable(f"{fn}: the client is closed", {})
        call_id = call_id or f"{self._id_prefix}-{next(self._ids)}"
        wait_s = timeout or self.timeout
        fields: list[Arg] = ["XADD", self.stream, "*", "id", call_id, "fn", fn, "body", body,
                             "reply", self.reply_key]
        if self.caller:
            fields += ["caller", self.caller]
        if context:
            fields += ["context", msgspec.json.encode(dict(context))]
        if deadline_ms is not None:
            fields += ["deadline_ms", deadline_ms]
        waiter = self._pending[call_id] = _Waiter()
        try:
            for _ in range(self.retries + 1):
                waiter.deadline = time.monotonic() + wait_s
                # Sent without waiting for Redis to say so: one wake-up per call, not two.
                xadd = self.conn.send_pipeline([fields])
                if xadd is None:  # not connected yet
                    try:
                        await self.conn.execute(*fields)
                    except ConnectionLost as exc:
                        raise Unavailable(f"{fn}: Redis unavailable: {exc}",
                                          {"call_id": call_id}) from exc
                else:
                    xadd.add_done_callback(waiter.sent)
                await waiter.future
                if waiter.reply is not None:
                    break
                if waiter.error is not None:
                    raise Unavailable(f"{fn}: the call could not be sent: {waiter.error}",
                                      {"call_id": call_id}) from waiter.error
                if self._closed:
                    raise Unavailable(f"{fn}: the client was closed before the reply came "
                                      f"(call id {call_id})", {"call_id": call_id})
                waiter.future = asyncio.get_running_loop().create_future()
        finally:
            del self._pending[call_id]
        reply = waiter.reply
        if reply is None:
            raise CallTimeout(f"{fn}: no reply within {wait_s}s after "
                              f"{self.retries + 1} attempts (call id {call_id})",
                              {"call_id": call_id})
        if not reply.ok:
            error = reply.error
            raise error_from(str(error.get("code", "INTERNAL")), str(error.get("message", "")),
                             error.get("details") or {})
        return bytes(reply.result)

    async def call(self, fn: str, body: Any, **options: Any) -> Any:
        """Like `call_json`, body and result as Python values (tagged types converted)."""
        data = body if isinstance(body, bytes | str) else msgspec.json.encode(
            codec.to_json_tree(body))
        return codec.decode_value(await self.call_json(fn, data, **options))

    # ---- typed helpers -----------------------------------------------------------------------
    async def get(self, scope: str, key: str) -> Any:
        return await self.call("state::get", {"scope": scope, "key": key})

    async def set(self, scope: str, key: str, value: Any, **options: Any) -> Any:
        return await self.call("state::set", {"scope": scope, "key": key, "value": value,
                                              **options})

    async def delete(self, scope: str, key: str) -> Any:
        return await self.call("state::delete", {"scope": scope, "key": key})

    async def list(self, scope: str) -> Any:
        return await self.call("state::list", {"scope": scope})

    async def list_keys(self, scope: str) -> Any:
        return (await self.call("state::list_keys", {"scope": scope}))["keys"]

    async def list_groups(self) -> Any:
        return (await self.call("state::list_groups", {}))["groups"]

    async def update(self, scope: str, key: str, ops: builtins.list[dict[str, Any]], **options: Any) -> Any:
        return await self.call("state::update", {"scope": scope, "key": key, "ops": ops,
                                                 **options})

    async def compare_and_set(self, scope: str, key: str, value: Any,
                              expected: Any = ABSENT) -> Any:
        body = {"scope": scope, "key": key, "value": value}
        if expected is not ABSENT:
            body["expected"] = expected
        return await self.call("state::compare-and-set", body)

    async def get_entry(self, scope: str, key: str, **options: Any) -> Any:
        return await self.call("state::get-entry", {"scope": scope, "key": key, **options})

    async def list_entries(self, scope: str, **options: Any) -> Any:
        return await self.call("state::list-entries", {"scope": scope, **options})

    async def diff(self, scope: str, key: str, value: Any, **options: Any) -> Any:
        return await self.call("state::diff", {"scope": scope, "key": key, "value": value,
                                               **options})

    async def update_topic(self, scope: str, key: str, topic: str | None) -> Any:
        return await self.call("state::update-topic", {"scope": scope, "key": key,
                                                       "topic": topic})

    async def delete_by_topic(self, scope: str, topic_pattern: str) -> Any:
        return await self.call("state::delete-by-topic", {"scope": scope,
                                                          "topic_pattern": topic_pattern})

    async def list_namespaces(self, **options: Any) -> Any:
        return await self.call("state::list-namespaces", options)
