"""Plans: a state operation as the Redis commands it needs and what to make of their replies.

A `Plan` holds commands (usually one FCALL) and `finish(replies)`, which returns the result,
raises a StateError, or returns the next Plan (a second step: store a hash, the next batch of
a delete-by-topic ...). Written this way, one call and a thousand calls run the same code:
`execute_many` sends the commands of every plan in one pipeline, finishes them all, and sends
the next steps together again. The bus runs each batch of calls read from its stream this way,
so a batch costs one round trip per step, not one per call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from stateworker.errors import InternalError, ResourceExhausted, ScriptError, StateError, Unavailable
from stateworker.logs import repeats
from stateworker.transport.connection import RedisConnection
from stateworker.transport.retry import transient_reason
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError

log = logging.getLogger("stateworker.transport.plans")

Sent: TypeAlias = "asyncio.Future[list[Any]] | None"  # a first step already on the wire


FUNCTION_MISSING = "Function not found"  # FCALL's error for a function Redis does not have


class Library(Protocol):
    """What a pipeline needs of the script library (scripts/library.py): loading it again."""

    async def load(self) -> None:
        """Load the library; ScriptError (naming the cause) when Redis refuses it."""


class Answered:
    """The result of a plan whose script wrote its bus call's reply and acknowledged the
    call's entry itself (context.Answer): nothing is left to answer."""

    def __repr__(self) -> str:
        return "ANSWERED"


ANSWERED = Answered()


class Replied(Answered):
    """The result of a plan whose script wrote its bus call's reply, the call's entry left to
    the service to acknowledge (on a cluster, the stream on another node than the state)."""

    def __repr__(self) -> str:
        return "REPLIED"


REPLIED = Replied()


class RunsNow(Unavailable):
    """A call met its id's live claim (state/core/once.py): the same call runs now, elsewhere
    or here, or died and left its claim. Not Redis away: over the bus its entry is left
    pending, and a reclaim serves it again (then from its record), while every other call goes
    on (bus/runtime.py)."""


class RedisFull(ResourceExhausted):
    """Redis at its `maxmemory` refused a write (OOM): that command did not run. Over the bus
    it is no answer to the call: Redis refuses a call's script before the script could find
    the call's record, so a delivery again of a call that ran (its reply refused as Redis
    filled up, or a re-send) would be told "nothing was written" of a call that was applied.
    Its entry is left pending instead (bus/serving.py), served once Redis has room."""


@dataclass(slots=True)
class Plan:
    commands: list[list[Arg]] = field(default_factory=list)
    finish: Callable[[list[Any]], Any] = lambda replies: None
    checks_deadline: bool = False  # its script checks the call's deadline (after its record)
    binds_call_id: bool = False  # its script binds the bus call's id (entry scripts)


def then(plan: Plan, fn: Callable[[Any], Any]) -> Plan:
    """`plan`, with its final result (after any further steps) passed through `fn`."""
    def finish(replies: list[Any]) -> Any:
        out = plan.finish(replies)
        if out is ANSWERED:
            return out
        return then(out, fn) if isinstance(out, Plan) else fn(out)

    return Plan(plan.commands, finish, plan.checks_deadline, plan.binds_call_id)


def redis_error(reply: ReplyError, what: str) -> StateError:
    """The error a caller gets for Redis's error reply to `what`."""
    text = str(reply)
    if text.startswith("OOM"):
        repeats.log(log, logging.WARNING, "Redis refused a write: out of memory (maxmemory)",
                    extra={"event": "redis.oom", "what": what})
        return RedisFull(
            f"{what}: Redis refused the write because it reached its memory limit "
            "(maxmemory); nothing was written. Free memory or raise Redis's maxmemory.",
            {"redis_error": text[:200]})
    if transient_reason(reply) is not None:  # LOADING, BUSY ...: it did not run; try later
        return Unavailable(f"{what}: Redis is not serving for now ({text[:200]}); it did not run",
                           {"redis_error": text[:200]})
    return InternalError(f"{what} failed: {text}")


def command_reply(reply: Any, what: str) -> Any:
    if isinstance(reply, ReplyError):
        raise redis_error(reply, what)
    return reply


async def checked_pipeline(conn: RedisConnection, commands: Sequence[Sequence[Arg]],
                           what: str) -> list[Any]:
    """A pipeline whose every reply must succeed: an error reply (NOPERM, OOM ...) is raised
    (redis_error, naming `what` and the command), not gone on past."""
    return [command_reply(reply, f"{what}: {command[0]!s}") for command, reply
            in zip(commands, await conn.pipeline(commands), strict=True)]


def send_first_step(conn: RedisConnection, plans: Sequence[Plan]) -> Sent:
    """Put the first step of `plans` on the wire at once (None when not connected); pass the
    result to `execute_many`, which then only waits for the replies."""
    commands = [command for plan in plans for command in plan.commands]
    return conn.send_pipeline(commands) if commands else None


async def pipeline(conn: RedisConnection, library: Library, commands: Sequence[Sequence[Arg]],
                   sent: Sent = None) -> list[Any]:
    """Send commands back to back (or wait for those already `sent`); when Redis lost the
    script library (a restart without persistence, FUNCTION FLUSH) it is loaded again and the
    calls that found their function missing are repeated (they did not run)."""
    try:
        results = await sent if sent is not None else await conn.pipeline(commands)
        missing = [i for i, r in enumerate(results)
                   if isinstance(r, ReplyError) and FUNCTION_MISSING in str(r)]
        if missing:
            try:
                await library.load()
            except ScriptError as exc:  # (out of memory, a read-only replica ...)
                # Those calls did not run: each fails alone, and the service goes on.
                log.error("%s", exc, extra={"event": "scripts.load_failed"})
                for i in missing:
                    results[i] = ReplyError(str(exc))
                return results
            retried = await conn.pipeline([commands[i] for i in missing])
            for i, result in zip(missing, retried, strict=True):
                results[i] = result
    except ConnectionLost as exc:
        raise Unavailable(f"Redis unavailable: {exc}") from exc
    return results


async def execute_many(conn: RedisConnection, library: Library, plans: Sequence[Plan],
                       sent: Sent = None, done: Callable[[int, Any], None] | None = None,
                       after_step: Callable[[], Awaitable[None]] | None = None) -> list[Any]:
    """Run plans together, step by step, one pipeline per step; each result is the plan's
    result or the StateError it ended with. `sent`: the first step, from send_first_step.
    `done(index, result)` is told as soon as a plan ends; `after_step` runs after each step
    in which one did (a service writes those replies then, not after the slowest plan)."""
    results: list[Any] = [None] * len(plans)

    def finished(index: int, result: Any) -> None:
        results[index] = result
        if done is not None:
            done(index, result)

    pending = list(enumerate(plans))
    while pending:
        commands = [command for _, plan in pending for command in plan.commands]
        try:
            replies = await pipeline(conn, library, commands, sent) if commands else []
            sent = None
        except StateError as exc:  # Redis away: every plan of the step fails alike
            for index, _ in pending:
                finished(index, exc)
            return results
        position, waiting = 0, []
        for index, plan in pending:
            mine = replies[position:position + len(plan.commands)]
            position += len(plan.commands)
            try:
                out = plan.finish(mine)
            except StateError as exc:
                finished(index, exc)
                continue
            except Exception as exc:  # a bug costs one call, not the batch
                log.exception("finishing a plan failed", extra={"event": "plan.crashed"})
                finished(index, InternalError(f"the service failed: {type(exc).__name__}"))
                continue
            if isinstance(out, Plan):
                waiting.append((index, out))
            else:
                finished(index, out)
        if after_step is not None and waiting and len(waiting) < len(pending):
            await after_step()
        pending = waiting
    return results
