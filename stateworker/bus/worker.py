"""`Worker`: a user's own service on the bus, with the state service's guarantees.

    worker = Worker(service="orders")

    @worker.function("orders::create")
    async def create(body, call):
        return {"created": body["id"]}

    await worker.run()    # or worker.serve() from a script

Replies are recorded by call id (for `dedupe_window_ms`): a call delivered again (a retry,
a redelivery after a crash) gets the recorded reply and the function does not run again;
delivered again while it runs (the client's re-send, on this worker or another: the id is
claimed for the visibility timeout before the run), it is acknowledged without a reply and the
run answers.
A crash after the function's side effects but before the reply was written runs it again
(at-least-once) - make such effects idempotent with the call id (`call.id`).

Per-function options: `@worker.function("orders::create", timeout=5.0)` cancels a run that
takes longer than 5 s and answers it with DEADLINE_EXCEEDED (see `Worker.function`).

Redis away or not serving for a while (restarting, LOADING its dataset ...) never stops a
worker: at start it waits for Redis (one log line names the URL and how to start the
service; `start_wait_s` bounds the wait), and while serving its loops back off and go on
(bus/runtime.py).
"""

from __future__ import annotations

import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus
from opentelemetry.trace import SpanKind

from stateworker import codec, logs, pyvalues, tracing
from stateworker.bus.protocol import Bus, BusOptions, Call
from stateworker.bus.runtime import BusRuntime
from stateworker.errors import (
    ConfigError,
    DeadlineExceeded,
    InternalError,
    InvalidRequest,
    Unavailable,
    UnknownFunction,
    shown,
)
from stateworker.loop import run
from stateworker.settings import Settings
from stateworker.transport.connect import connection_for, probed
from stateworker.transport.connection import RedisConnection, check_url
from stateworker.transport.embedded import bus_url
from stateworker.transport.redis_clock import follow_clock, may_read_clock, sync_clock
from stateworker.transport.retry import no_redis_text, transient_reason, wait_ready
from stateworker.transport.wire import ConnectionLost, ReplyError

log = logging.getLogger("stateworker.bus")  # (the runtime's: one logger for the bus's lines)

Function = Callable[[Any, Call], Awaitable[Any]]


class FunctionOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How one registered function is run.

    Attributes:
        timeout: seconds a run may take (from the function's start, after the body was
            decoded); a longer run is cancelled and answered with DEADLINE_EXCEEDED.
            None: no limit (calls still end at the worker's stop grace period).
    """

    timeout: float | None = None


class Worker:
    """Serves the functions registered with `@worker.function(name)` on `<prefix>:bus:<service>`."""

    def __init__(self, service: str, redis_url: str | None = None, *,
                 options: BusOptions | None = None, settings: Settings | None = None,
                 start_wait_s: float | None = None) -> None:
        """A worker for `service`; nothing connects before `run()`.

        Args:
            service: the service name: calls are read from `<prefix>:bus:<service>`
                (consumer group `<service>`; with STATEWORKER_BUS_SHARDS > 1 from every
                shard of it); functions are named `<service>::<name>`.
            redis_url: `redis://host:port/db` or `unix:///path.sock`; default
                STATEWORKER_REDIS_URL, else the embedded Redis's socket under `state_dir`.
                With STATEWORKER_BUS_REDIS_URL set, the bus is there instead (the bus on a
                Redis of its own).
            options: how the stream is read and answered (concurrency, grace_s, consumer ...).
            settings: all settings at once (then `redis_url` and the environment are ignored).
            start_wait_s: how long `run()` waits at start for a Redis that refuses
                connections or is loading (one warning line names the URL and how to start
                the service); None (default): as long as it takes.

        Raises:
            ConfigError: a STATEWORKER_* variable is invalid, or the URL's scheme is not
                redis:// or unix:// (not a StateError: no code).

        Example: `worker = Worker("orders", options=BusOptions(grace_s=5))`
        """
        self.service = service
        self.settings = settings or Settings.from_env(redis_url=redis_url)
        check_url(bus_url(self.settings))
        self.start_wait_s = start_wait_s
        self.options = options or BusOptions()
        self.functions: dict[str, Function] = {}
        self.function_options: dict[str, FunctionOptions] = {}
        self.runtime: BusRuntime | None = None
        self._opening: anyio.CancelScope | None = None  # the wait for Redis at start

    def function(self, name: str | None = None, *,
                 timeout: float | None = None) -> Callable[[Function], Function]:
        """Register an async `fn(body, call)`; its return value (JSON-able) is the result.

        The body arrives as Python values (tagged types such as Decimal converted); `call`
        has `id`, `fn`, `deadline_ms` and `ctx` (`ctx.caller`, `ctx.context`). Registering a
        name again replaces the function and its options. A call whose context names a
        `traceparent` runs inside its OpenTelemetry span (tracing.py), the current one.

        Args:
            name: the function id callers use; default `<service>::<fn.__name__>`.
            timeout: seconds one run may take, counted from the function's start; a longer
                run is cancelled (anyio cancellation at its next await) and answered with
                DeadlineExceeded naming the function and the limit. That reply is recorded
                like any other: a retry with the same call id gets it again, so retry with a
                new id. Effects the run made before it was cancelled stay. Default None: no
                limit.

        Raises:
            ValueError: `timeout` is not a positive, finite number (at registration).

        What a caller gets back as error replies (codes) for calls of these functions:
            UnknownFunction (UNKNOWN_FUNCTION): no function of that name is registered.
            InvalidRequest (INVALID_REQUEST): the body is not valid JSON or the call entry is
                malformed.
            ValueTooLarge (VALUE_TOO_LARGE): the body is over `max_body_bytes`.
            DeadlineExceeded (DEADLINE_EXCEEDED): the call's `deadline_ms` passed before it
                ran, or the run took longer than `timeout`.
            InternalError (INTERNAL): the function raised an exception that is not a
                StateError (logged; a StateError it raises is answered with its own code), or
                returned a result that cannot be encoded as JSON.

        Example: `@worker.function("orders::create", timeout=5.0)` above
            `async def create(body, call): return {"created": body["id"]}`
        """
        if timeout is not None:
            if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                    or not math.isfinite(timeout) or timeout <= 0):
                raise ValueError(f"timeout: must be a positive number of seconds, got {shown(timeout)}")
            timeout = float(timeout)
        options = FunctionOptions(timeout=timeout)

        def register(fn: Function) -> Function:
            fn_name = name or f"{self.service}::{fn.__name__}"
            self.functions[fn_name] = fn
            self.function_options[fn_name] = options
            return fn

        return register

    async def _handle(self, call: Call) -> bytes:
        if tracing.TRACEPARENT in call.ctx.context:
            # A traced call runs in its span (child of the caller's: a client's, a trigger
            # delivery's), current while the function runs: the spans it makes and the calls
            # it sends nest under it. A trigger call (no reply list) is consumed: CONSUMER.
            with tracing.serving(call.fn, call.ctx.context, call.id, call.ctx.caller,
                                 SpanKind.SERVER if call.reply else SpanKind.CONSUMER):
                return await self._serve(call)
        return await self._serve(call)

    async def _serve(self, call: Call) -> bytes:
        fn = self.functions.get(call.fn)
        if fn is None:
            raise UnknownFunction(f"fn: unknown function {shown(call.fn)}; service {shown(self.service)} "
                                  f"serves {', '.join(sorted(self.functions))}", {"fn": call.fn})
        try:
            body = pyvalues.decode_value(call.body)
        except ValueError as exc:
            raise codec.surrogate_error(call.body, "$") or InvalidRequest(
                f"$: the request body is not valid JSON: {exc}", {"path": "$"}) from exc
        options = self.function_options.get(call.fn)
        timeout = None if options is None else options.timeout
        if timeout is None:
            result = await fn(body, call)
        else:
            # Our own scope: a TimeoutError the function raises itself stays its own error
            # (INTERNAL), and a cancellation from outside (the stop's grace period) passes.
            with anyio.move_on_after(timeout) as scope:
                result = await fn(body, call)
            if scope.cancelled_caught:
                raise DeadlineExceeded(
                    f"{call.fn} ran longer than its timeout of {timeout} s and was cancelled; "
                    "effects it made before that stay", {"fn": call.fn, "timeout_s": timeout})
        try:
            return msgspec.json.encode(pyvalues.to_json_tree(result))
        except (InvalidRequest, TypeError, ValueError, OverflowError, RecursionError) as exc:
            # The function's own result: the service's fault, not the caller's request.
            raise InternalError(f"{call.fn} returned a result that cannot be sent as JSON: "
                                f"{type(exc).__name__}: {exc}", {"fn": call.fn}) from exc

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()`; calls already read are answered before it returns.

        Calls in flight at the stop get `options.grace_s` to finish; the rest are cancelled
        and stay pending for another worker. Errors of single calls are replies, never
        exceptions here. Logs one line when it serves (service, stream, consumer, functions).
        A Redis that refuses connections or is loading is waited for at start (see
        `start_wait_s`) and ridden out while serving (back off, go on).

        Args:
            task_status: for `TaskGroup.start`: started once the consumer group exists.

        Raises:
            Unavailable (UNAVAILABLE): no Redis served within `start_wait_s` (when set); the
                message names the URL and how to start the service.
            ReplyError: Redis refused to create the consumer group (e.g. the stream key
                holds another type).

        Example: `async with anyio.create_task_group() as tg: await tg.start(worker.run)`
        """
        conn = await self._connect()
        if conn is None:  # stopped while waiting for Redis
            task_status.started()
            return
        self.runtime = BusRuntime(conn, Bus(self.settings.prefix, self.service,
                                            self.settings.bus_shards), self.options,
                                  handler=self._handle,
                                  record_ttl_ms=self.settings.dedupe_window_ms,
                                  start_wait_s=self.start_wait_s,
                                  describe={"functions": ",".join(sorted(self.functions))},
                                  functions=self.functions)
        try:
            if not may_read_clock(conn):  # (a principal's rule has no TIME)
                await self.runtime.run(task_status=task_status)
                return
            # Deadlines judged on Redis's clock, as the service sets and judges them
            # (transport/redis_clock.py): read before the first call, then every second.
            await sync_clock(conn)
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow_clock, conn)
                await self.runtime.run(task_status=task_status)
                tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # (the runtime's error as itself, not a group)
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await conn.close()

    async def _connect(self) -> RedisConnection | None:
        """The worker's connection, once its Redis answers (waited for as `start_wait_s`
        says): a ClusterConnection when its one URL names a Redis Cluster node, asked once as
        the service and StateClient ask (else the first MOVED would stop the worker). None:
        `stop()` came while waiting."""
        conn = connection_for(bus_url(self.settings),
                              connect_timeout_s=self.settings.connect_timeout_s,
                              read_timeout_s=self.settings.read_timeout_s)
        try:
            with anyio.CancelScope() as self._opening:
                await wait_ready(conn, self.start_wait_s, self._waiting(conn))
                # (as a client's: a URL naming an ACL user is not asked, a principal's rule
                # has no INFO; such a worker names a cluster by listing its seeds)
                return await probed(conn, as_user=False)
        except (ConnectionLost, ReplyError) as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()
            if transient_reason(exc) is None:
                raise  # (a refusal for good: the runtime's start raises it as well)
            raise Unavailable(f"{_not_serving(conn, exc)}; gave up after {self.start_wait_s:g} s",
                              {"redis": conn.shown}) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close()
            raise
        finally:
            self._opening = None
        with anyio.CancelScope(shield=True):  # (reached only when stop() cancelled the wait)
            await conn.close()
        return None

    def _waiting(self, conn: RedisConnection) -> Callable[[BaseException], None]:
        """Logs the wait for Redis once (the runtime's line: the URL, how to start it)."""
        told = False

        def waiting(exc: BaseException) -> None:
            nonlocal told
            if told:
                return
            told = True
            bound = "" if self.start_wait_s is None else f" (at most {self.start_wait_s:g} s)"
            log.warning("%s; waiting for it%s", _not_serving(conn, exc), bound,
                        extra={"event": "bus.waiting", "service": self.service,
                               "redis": conn.shown})
        return waiting

    def stop(self) -> None:
        """Stop reading; `run()` returns once calls in flight are answered (or the grace
        period is over). Safe to call before `run()` (then it does nothing) and twice.

        Raises: nothing.

        Example: `worker.stop()`
        """
        if self._opening is not None:  # still waiting for Redis: stop waiting
            self._opening.cancel()
        if self.runtime is not None:
            self.runtime.stop()

    def serve(self) -> None:
        """Run until SIGINT or SIGTERM (for a worker's own `__main__`), on uvloop when
        installed. Blocks; must not be called from inside a running event loop. Logs JSON
        lines on stderr unless logging is configured already. A worker that cannot start
        (no Redis within `start_wait_s`, a bad setting) exits with one line on stderr, not
        a traceback: status 1 (UNAVAILABLE), 2 (configuration).

        Raises:
            SystemExit: as above.
            ReplyError: as `run()`.

        Example: `if __name__ == "__main__": worker.serve()`
        """
        if not logging.getLogger().handlers and not logging.getLogger("stateworker").handlers:
            logs.configure("INFO")

        async def main() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.run)  # a signal stops it while it waits for Redis too
                    async for _ in signals:
                        self.stop()
                        break

        try:
            run(main)
        except BaseException as exc:  # a start failure comes wrapped in the task group's
            cause = exc
            while isinstance(cause, BaseExceptionGroup) and len(cause.exceptions) == 1:
                cause = cause.exceptions[0]
            if isinstance(cause, Unavailable | ConfigError):
                print(f"worker {self.service}: {cause}", file=sys.stderr)
                raise SystemExit(1 if isinstance(cause, Unavailable) else 2) from None
            raise


def _not_serving(conn: RedisConnection, exc: BaseException) -> str:
    """Why Redis does not serve the worker yet, as the runtime says it."""
    if isinstance(exc, ConnectionLost):
        return no_redis_text(conn.url, exc)
    return f"Redis at {conn.shown} is not serving yet ({exc})"
