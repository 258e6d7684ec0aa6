"""The TTL reaper: deletes expired entries in bounded batches, one event each.

Reads already treat an expired entry as missing; the reaper only makes the deletion (and its
`state:deleted` event) happen soon after expiry even when nobody touches the key. Each round
also forgets the scopes last written before the dedupe window (`PartitionKeys.written`), so
that record holds only the scopes written within it, and removes the triggers whose lease
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
from stateworker.scripts.replies import ReapReply
from stateworker.scripts.upkeep_bindings import REAP, reap_call
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import trigger_leases
from stateworker.transport.plans import Plan, command_reply
from stateworker.transport.wire import Arg

log = logging.getLogger("stateworker.state.expiry")


async def reap_partition(state: RedisState, part: PartitionKeys) -> tuple[int, bool]:
    """Delete one batch of expired entries; returns (deleted, more are due)."""
    plan = state.script_plan(REAP, reap_call(state.settings, part), lambda reply: reply)
    done: ReapReply = await state.execute(plan)
    return done.deleted, done.more


async def reap_expired(state: RedisState) -> int:
    """Delete every entry expired by now, partition by partition; returns how many."""
    total = 0
    for part in state.keys.all_partitions():
        more = True
        while more:
            deleted, more = await reap_partition(state, part)
            total += deleted
    return total


async def forget_old_writes(state: RedisState) -> int:
    """Drop from every partition's `written` record the scopes last written before the dedupe
    window (one ZREMRANGEBYSCORE each, in one pipeline: exact and atomic, so a scope written
    meanwhile keeps its new score); returns how many were dropped."""
    before = now_ms() - state.settings.dedupe_window_ms
    commands: list[list[Arg]] = [["ZREMRANGEBYSCORE", part.written, "-inf", f"({before}"]
                                 for part in state.keys.all_partitions()]

    def finish(replies: list[Any]) -> int:
        return sum(int(command_reply(reply, "forgetting old writes")) for reply in replies)

    dropped: int = await state.execute(Plan(commands, finish))
    return dropped


async def reaper_loop(state: RedisState, *,
                      task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        try:
            await reap_expired(state)
            await forget_old_writes(state)
            await trigger_leases.reap_triggers(state)
        except StoreLost:  # (the generation watch says so, once)
            pass
        except StateError as exc:  # Redis away for a moment: the next round retries
            log.warning("reaper round failed: %s", exc)
        await anyio.sleep(state.settings.reaper_interval_s)
