"""The upgrade of a prefix's entries to the packed layout (lua/includes/packed.lua), run at
start (lifecycle.connect) until `meta` says it is done: entries stored as hashes become packed
strings, and the topic indexes drop their untagged members (lua/repack.lua), partition by
partition, in SCAN batches. A new prefix is marked done at once. Services of the older
layout must not write to the prefix meanwhile: stop them before the upgrade (docs/
architecture.md, "Packed entries")."""

from __future__ import annotations

import logging
from typing import Any

from stateworker.keys import PartitionKeys
from stateworker.scripts.bindings import REPACK
from stateworker.state.store import RedisState

log = logging.getLogger("stateworker.state.repack")

LAYOUT_FIELD, PACKED = "entries", b"packed"  # the meta field that says the layout is packed
SCAN_COUNT = 500


async def upgrade(state: RedisState) -> int:
    """Bring the prefix's entries to the packed layout (once): the entries changed."""
    keys = state.keys
    if await state.conn.execute("HGET", keys.meta, LAYOUT_FIELD) == PACKED:
        return 0
    changed = 0
    if not state.created:
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


async def _repack(state: RedisState, part: PartitionKeys, what: str, pattern: str,
                  kind: str) -> int:
    """repack.lua over every name of `kind` matching `pattern` in the partition."""
    changed = 0
    cursor: Any = b"0"
    while True:
        cursor, names = await state.conn.execute("SCAN", cursor, "MATCH", pattern,
                                                 "COUNT", SCAN_COUNT, "TYPE", kind)
        if names:
            plan = state.script_plan(REPACK, ([part.scopes], [what, *names]),
                                     lambda reply: reply.number)
            changed += await state.execute(plan)
        if cursor in (b"0", "0"):
            return changed
