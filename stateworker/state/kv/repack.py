"""The upgrade of a prefix's entries to the packed layout (lua/includes/packed.lua), run at
start (lifecycle.connect) until `meta` says it is done: entries stored as hashes become packed
strings, and the topic indexes drop their untagged members (lua/repack.lua), partition by
partition, in SCAN batches. A new prefix is marked done at once. Services of the older
layout must not write to the prefix meanwhile: while any serves it (a live dispatcher
heartbeat) the start is refused, saying so (docs/decisions/0008-packed-entries.md)."""

from __future__ import annotations

import logging
from typing import Any

from stateworker.clock import now_ms
from stateworker.errors import ConfigError, shown
from stateworker.keys import PartitionKeys
from stateworker.scripts.upkeep_bindings import REPACK, repack_call
from stateworker.settings import LIVE_LEASES
from stateworker.state.core.store import RedisState

log = logging.getLogger("stateworker.state.kv.repack")

LAYOUT_FIELD, PACKED = "entries", b"packed"  # the meta field that says the layout is packed
SCAN_COUNT = 500


async def upgrade(state: RedisState) -> int:
    """Bring the prefix's entries to the packed layout (once): the entries changed.

    Raises:
        ConfigError: the prefix is not upgraded yet and services are serving it (their
            dispatchers' heartbeats are live): services of the older layout, which would
            write entries this one cannot read. Stop them first."""
    keys = state.keys
    if await state.conn.execute("HGET", keys.meta, LAYOUT_FIELD) == PACKED:
        return 0
    changed = 0
    if not state.created:
        await _refuse_while_served(state)
        for n, part in enumerate(keys.all_partitions()):
            packed = await _repack(state, part, "entries", part.entry_prefix + "*", "hash")
            await _repack(state, part, "topics", part.tag + "t:*", "zset")
            if packed:  # (progress of a long upgrade: a line per partition)
                log.info("packed %d entries of partition %d of %d", packed, n + 1,
                         keys.partitions)
            changed += packed
        if changed:
            log.warning("upgraded %d entries of prefix %s to the packed layout", changed,
                        state.settings.prefix)
    await state.conn.execute("HSET", keys.meta, LAYOUT_FIELD, PACKED)
    return changed


async def _refuse_while_served(state: RedisState) -> None:
    live_ms = LIVE_LEASES * state.settings.lease_ms
    serving = int(await state.conn.execute("ZCOUNT", state.keys.replicas, now_ms() - live_ms,
                                           "+inf"))
    if serving:
        raise ConfigError(
            f"prefix {shown(state.settings.prefix)} holds entries of the layout before packed "
            f"entries, and {serving} service(s) of that version serve it (a heartbeat in "
            f"{state.keys.replicas} within the last {live_ms // 1000} s): stop them, then start "
            "this version, which upgrades the entries once at its start (they would write "
            "entries it cannot read)")


async def _repack(state: RedisState, part: PartitionKeys, what: str, pattern: str,
                  kind: str) -> int:
    """repack.lua over every name of `kind` matching `pattern` in the partition."""
    changed = 0
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH", pattern,
                                                 "COUNT", SCAN_COUNT, "TYPE", kind)
        if names:
            plan = state.script_plan(REPACK, repack_call(part, what, names),
                                     lambda reply: reply.number)
            changed += await state.execute(plan)
        if cursor in (b"0", "0"):
            return changed
