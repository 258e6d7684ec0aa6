"""The console's reads beyond the call API (app/console.py routes them): a key's recent
changes, the overview (the status report, barriers, namespaces, principals, and the bus's
recent rates), and the key counts of scopes.

`Rates` keeps the state service's counters of the last minutes in memory (a sample every
RATE_EVERY_S): a page opened shows the calls per second and the latency of the last minutes
at once, rather than a graph that starts empty on every load.
"""

from __future__ import annotations

import collections
from typing import Any

import anyio
import msgspec

from stateworker.app.cli.status import status_report
from stateworker.clock import now_ms
from stateworker.keys import stats_key
from stateworker.state.core.store import RedisState
from stateworker.transport.wire import ConnectionLost, ReplyError

BARRIERS_SHOWN = 100  # the overview's barriers: at most this many (SCAN order)
RATE_EVERY_S = 2.0  # the rates' sampling period (the overview polls as often)
RATE_SAMPLES = 150  # ... and how many are kept: the last 5 minutes
COUNTED_SCOPES = 500  # the scopes one count request may name


class Rates:
    """The state service's call counters (`calls`, `latency_us_sum`), sampled every
    RATE_EVERY_S while the HTTP face serves: `[ms, calls, latency_us_sum]`, oldest first."""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        self.samples: collections.deque[list[int]] = collections.deque(maxlen=RATE_SAMPLES)

    async def run(self) -> None:
        while True:
            await self.sample()
            await anyio.sleep(RATE_EVERY_S)

    async def sample(self) -> None:
        try:
            calls, latency = await self.state.bus_conn.execute(
                "HMGET", stats_key(self.state.settings.prefix, "state"), "calls",
                "latency_us_sum")
        except (ConnectionLost, ReplyError):  # (a gap in the graph; the overview says why)
            return
        self.samples.append([now_ms(), int(calls or 0), int(latency or 0)])


async def overview(state: RedisState, rates: Rates) -> dict[str, Any]:
    """The front page: the status report (with the triggers and the lag of the partitions
    they read; each service `stalled` or not), the claimed namespaces, the principals and
    roles, and the recent rates (`Rates`)."""
    report = await status_report(state.settings, state.conn,  # (no connection of its own)
                                 state.bus_conn)
    access = state.access
    return {"status": report, "triggers": report.get("triggers", []),
            "barriers": await _barriers(state), "rates": list(rates.samples),
            "namespaces": _namespaces(state),
            "principals": {name: msgspec.to_builtins(access.principal(name))
                           for name in sorted(access.principals())},
            "roles": {name: msgspec.to_builtins(role)
                      for name, role in sorted(access.roles().items())}}


def _namespaces(state: RedisState) -> dict[str, list[str]]:
    """Each private namespace (functions prefix) and the scopes it claimed."""
    owned: dict[str, list[str]] = {}
    for scope in sorted(state.claims.scopes):
        owner = state.claims.owner(scope)
        if owner is not None:
            owned.setdefault(owner, []).append(scope)
    return owned


async def _barriers(state: RedisState) -> dict[str, Any]:
    """Barriers with their arrivals (at most BARRIERS_SHOWN; `more`: there are others): each
    partition's barrier index (keys.PartitionKeys.barriers, kept by the barrier scripts), its
    first BARRIERS_SHOWN + 1 names and their counters, each in one pipeline. No SCAN: the
    overview is polled every 2 s, and finding barriers by SCAN walked the whole keyspace once
    a partition (at 1,000,000 keys, 16,000 SCANs and 11 s of Redis's time a poll). A barrier
    made before the index was, and not written since, is not listed."""
    parts = state.keys.all_partitions()
    listed = await state.conn.pipeline([["ZRANGE", part.barriers, 0, BARRIERS_SHOWN]
                                        for part in parts])
    ids: list[str] = []
    names: list[bytes] = []
    for part, found in zip(parts, listed, strict=True):
        for name in found if isinstance(found, list) else []:
            names.append(name)
            ids.append(part.barrier_id_of(name))
    more = len(names) > BARRIERS_SHOWN
    names, ids = names[:BARRIERS_SHOWN], ids[:BARRIERS_SHOWN]
    fields = await state.conn.pipeline([["HMGET", name, "E", "n", "c", "d"] for name in names])
    shown = [{"id": barrier_id, "expect": None if expect is None else expect.decode(
                  errors="replace"),
              "expected": int(expected or 0), "arrived": int(arrived or 0),
              "complete": payload is not None}
             for barrier_id, (expect, expected, arrived, payload) in zip(ids, fields, strict=True)
             if expect is not None]  # (expired, and not yet dropped from the index)
    return {"barriers": sorted(shown, key=lambda b: str(b["id"])), "more": more}


async def counts(state: RedisState, scopes: list[str]) -> dict[str, int]:
    """Each scope's keys: its key index's size (ZCARD, as state::list-indexes counts a
    scope's keys; an expired key counts until the reaper removes it), in one pipeline.
    Refused (STORE_LOST) as every read is where Redis lost the prefix or a restore writes it
    back (`RedisState.read_plan`): a scope not yet restored would count 0 keys."""
    if not scopes:
        return {}
    parts = list({id(part): part for part in map(state.keys.for_scope, scopes)}.values())

    def counted(replies: list[Any]) -> dict[str, int]:
        return {scope: int(reply) for scope, reply in zip(scopes, replies, strict=True)
                if isinstance(reply, int)}

    commands: list[list[Any]] = [["ZCARD", state.keys.for_scope(scope).key_index(scope)]
                                 for scope in scopes]
    result: dict[str, int] = await state.execute(state.read_plan(parts, commands, counted))
    return result
