"""What a dispatcher reads of the trigger registrations when the registry stream moves.

Every change of a registration (register, unregister, a lease's renewal, a reap: lua/
trigger.lua, lua/keeptrigger.lua) appends one registry entry `kind triggers id <id>`, and
every replica's dispatcher follows the stream. Rereading every registration on each
(HGETALL, up to MAX_TRIGGERS_BYTES) made one caller renewing many short leases cost every
replica the whole registry several times a second; so the ids the entries name are reread
alone (HMGET) and the dispatcher's TriggerSet is updated in place (`changed`). A renewal is
reread like any change: a trigger's lease is checked where it is matched (its `expires_at`,
reactive/matching.py), so every replica must hold the new one.

All of them are read again instead (`all_triggers`, None from `changed`) when the entries may
not name every change: an entry of another kind (a restore's `reload`, a claim ...) or one
without an id, a read of a full BATCH (more may wait behind it, and the events read with it
must meet every trigger registered before them), or entries trimmed from the stream before
they were read (its MAXLEN: a dispatcher that fell behind); and when they name more than
half the registrations loaded, where reading them all costs about as much (docs/decisions/
0064).
"""

from __future__ import annotations

from typing import Any

from stateworker.events.compaction import lost_after, stream_info
from stateworker.events.model import revision_of
from stateworker.schemas import Trigger
from stateworker.state.core.store import RedisState
from stateworker.state.reactive import triggers
from stateworker.transport.plans import command_reply

TRIGGERS = b"triggers"  # the registry entries' kind of a registration's change


def named_ids(entries: list[Any]) -> list[str] | None:
    """The trigger ids registry `entries` (XREAD's [id, [field, value ...]]) name, each once,
    in order; None when one is of another kind or names none."""
    ids: dict[str, None] = {}
    for _, flat in entries:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        named = fields.get(b"id")
        if fields.get(b"kind") != TRIGGERS or named is None:
            return None
        ids[named.decode()] = None
    return list(ids)


async def changed(state: RedisState, entries: list[Any], after: str, loaded: int,
                  batch: int) -> dict[str, Trigger | None] | None:
    """The registrations registry `entries` (read after the stream id `after`) name, as they
    are now (None: gone), from one round trip; None when every registration must be read
    again instead (module docstring). `loaded`: the registrations held; `batch`: the most
    entries one read takes."""
    ids = named_ids(entries)
    if ids is None or after == "0-0" or len(entries) >= batch or 2 * len(ids) > loaded:
        return None
    info, raw = await state.conn.pipeline([["XINFO", "STREAM", state.keys.registry],
                                           ["HMGET", state.keys.triggers, *ids]])
    if lost_after(revision_of(after), None, stream_info(info, state.keys.registry)):
        return None
    read = command_reply(raw, "reading the triggers")
    return {trigger_id: None if registration is None else triggers.decode_trigger(registration)
            for trigger_id, registration in zip(ids, read, strict=True)}


async def all_triggers(state: RedisState) -> list[Trigger]:
    """Every registration (the ones whose lease expired too: their matchers check it)."""
    raw = await state.conn.execute("HGETALL", state.keys.triggers)
    return [triggers.decode_trigger(r) for r in raw[1::2]]
