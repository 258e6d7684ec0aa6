"""The TTL reaper: deletes expired entries in bounded batches, one event each.

Reads already treat an expired entry as missing; the reaper only makes the deletion (and its
`state:deleted` event) happen soon after expiry even when nobody touches the key. Each round
also forgets the scopes last written before the dedupe window (`PartitionKeys.written`), so
that record holds only the scopes written within it, the completed barriers expired from the
barrier indexes (`PartitionKeys.barriers`), and removes the triggers whose lease
(`ttl_ms`) expired (state/reactive/trigger_leases.py).
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
from anyio.abc import TaskStatus

from stateworker.clock import now_ms
from stateworker.errors import StateError, StoreLost
from stateworker.keys import PartitionKeys
from stateworker.logs import repeats
from stateworker.scripts.replies import ReapReply
from stateworker.scripts.upkeep_bindings import REAP, reap_call
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import trigger_leases
from stateworker.transport.plans import Plan, command_reply
from stateworker.transport.wire import Arg

log = logging.getLogger("stateworker.state.expiry")


def _reap_plan(state: RedisState, part: PartitionKeys, shared: int = 1) -> Plan:
    """One partition's reap.lua, its share of a pipeline of `shared` (_shared_batch)."""
    batch, budget = _shared_batch(state, shared)
    return state.script_plan(REAP, reap_call(state.settings, part, batch, budget),
                             lambda reply: reply)


def _shared_batch(state: RedisState, partitions: int) -> tuple[int, int]:
    """Each partition's share of reaper_batch, and of max_call_bytes of values deleted, when
    `partitions` are reaped in one pipeline. Redis runs a pipeline's scripts back to back,
    serving no other client between them: a full batch each held them all for partitions x
    reaper_batch deletions (16 x 200 by default, ~100 ms); shared, a round trip deletes about
    one batch, as one reap.lua did before (at least one entry a partition:
    max(reaper_batch, partitions) in all), of about max_call_bytes (at most one value more a
    partition: 64 values of 1 MiB in one batch held Redis 0.42 s)."""
    shared = max(1, partitions)
    return (max(1, state.settings.reaper_batch // shared),
            max(1, state.settings.max_call_bytes // shared))


async def reap_partition(state: RedisState, part: PartitionKeys) -> tuple[int, bool]:
    """Delete one batch of expired entries; returns (deleted, more are due)."""
    done: ReapReply = await state.execute(_reap_plan(state, part))
    return done.deleted, done.more


async def reap_expired(state: RedisState, due: list[PartitionKeys] | None = None) -> int:
    """Delete every entry expired by now (in the partitions `due`; None: all); returns how
    many. Every partition's share of a batch goes in one pipeline (_shared_batch), again for
    those that have more. A partition whose reap fails is left out of the next pipelines,
    and the first such error is raised once the others are done."""
    total = 0
    failed: list[StateError] = []
    due = list(state.keys.all_partitions()) if due is None else due
    while due:
        results = await state.execute_many([_reap_plan(state, part, len(due)) for part in due])
        more = []
        for part, done in zip(due, results, strict=True):
            if isinstance(done, StateError):
                failed.append(done)
                continue
            total += done.deleted
            if done.more:
                more.append(part)
        due = more
    if failed:
        raise failed[0]
    return total


def _forget_plan(state: RedisState) -> Plan:
    now = now_ms()
    before = now - state.settings.dedupe_window_ms
    parts = state.keys.all_partitions()
    commands: list[list[Arg]] = [["ZREMRANGEBYSCORE", part.written, "-inf", f"({before}"]
                                 for part in parts]
    # (and the barrier indexes' completed barriers whose hash has expired: keys.barriers)
    commands += [["ZREMRANGEBYSCORE", part.barriers, "-inf", now] for part in parts]

    def finish(replies: list[Any]) -> int:
        for reply in replies[len(parts):]:
            command_reply(reply, "forgetting expired barriers")
        return sum(int(command_reply(reply, "forgetting old writes"))
                   for reply in replies[:len(parts)])

    return Plan(commands, finish)


async def forget_old_writes(state: RedisState) -> int:
    """Drop from every partition's `written` record the scopes last written before the dedupe
    window (one ZREMRANGEBYSCORE each, in one pipeline: exact and atomic, so a scope written
    meanwhile keeps its new score); returns how many were dropped."""
    dropped: int = await state.execute(_forget_plan(state))
    return dropped


async def reaper_round(state: RedisState) -> None:
    """The reaper's round: every partition's share of a first batch of expired entries
    (_shared_batch), the old writes forgotten and the first batch of expired triggers, in
    one pipeline; then what is left of each, if any. An idle service's round is then one
    round trip, not one a partition and step (18 in a row every 0.25 s, each a wake-up of
    the service and of Redis, held up the calls served between them)."""
    parts = list(state.keys.all_partitions())
    results = await state.execute_many(
        [*(_reap_plan(state, part, len(parts)) for part in parts), _forget_plan(state),
         trigger_leases.reap_plan(state)])
    # A step that failed (one partition's reap, Redis away) holds up none of the others: the
    # first error is raised after the follow-ups of those that did not fail.
    failed = [result for result in results if isinstance(result, StateError)]
    more = [part for part, done in zip(parts, results, strict=False)
            if not isinstance(done, StateError) and done.more]
    triggers = results[-1]
    if more:
        try:
            await reap_expired(state, more)
        except StateError as exc:
            failed.append(exc)
    if not isinstance(triggers, StateError) and triggers.more:
        try:
            await trigger_leases.reap_triggers(state)
        except StateError as exc:
            failed.append(exc)
    if failed:
        raise failed[0]


async def reaper_loop(state: RedisState, *,
                      task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        try:
            await reaper_round(state)
        except StoreLost:  # (the generation watch says so, once)
            pass
        except StateError as exc:  # Redis away for a moment: the next round retries
            repeats.log(log, logging.WARNING, "reaper round failed: %s", exc,
                        extra={"event": "reaper.failed"})
        await anyio.sleep(state.settings.reaper_interval_s)
