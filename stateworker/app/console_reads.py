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
BARRIER_SCANS = 20  # SCANs (COUNT 1000) one overview sends to find them, at most
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
    """Barriers with their arrivals (at most BARRIERS_SHOWN; `more`: there are others, or the
    walk stopped before the keyspace's end): barrier hashes found by SCAN, then their
    counters in one pipeline. The walk sends at most BARRIER_SCANS SCANs in all (each
    examines about 1000 keys): the overview is polled every 2 s, and a walk to the end of a
    keyspace of a million keys is a thousand SCANs. On one Redis a single walk finds every
    partition's barriers (a pattern naming them all); on a cluster each partition's tagged
    prefix is walked on its own node (SCAN routed by the tag)."""
    ids: list[str] = []
    names: list[bytes] = []
    parts = state.keys.all_partitions()
    prefix = state.settings.prefix
    walks = ([(part.barrier_prefix + "*", [part]) for part in parts] if state.cluster else
             [(f"{prefix}:{{{prefix}:p*}}:b:*", parts)])
    scans, ended = 0, True
    for pattern, owners in walks:
        cursor: Any = b"0"
        while len(names) <= BARRIERS_SHOWN:
            if scans == BARRIER_SCANS:
                ended = False
                break
            cursor, found = await state.conn.execute(
                "SCAN", cursor, "MATCH", pattern, "TYPE", "hash", "COUNT", 1000)
            scans += 1
            for name in found:
                part = next((p for p in owners if name.startswith(p.barrier_prefix.encode())),
                            None)
                if part is not None:  # (the pattern's `*` may reach into another key's name)
                    names.append(name)
                    ids.append(part.barrier_id_of(name))
            if cursor in (b"0", "0"):
                break
        if not ended:
            break
    more = len(names) > BARRIERS_SHOWN or not ended
    names, ids = names[:BARRIERS_SHOWN], ids[:BARRIERS_SHOWN]
    fields = await state.conn.pipeline([["HMGET", name, "E", "n", "c", "d"] for name in names])
    shown = [{"id": barrier_id, "expect": None if expect is None else expect.decode(
                  errors="replace"),
              "expected": int(expected or 0), "arrived": int(arrived or 0),
              "complete": payload is not None}
             for barrier_id, (expect, expected, arrived, payload) in zip(ids, fields, strict=True)]
    return {"barriers": sorted(shown, key=lambda b: str(b["id"])), "more": more}


async def counts(state: RedisState, scopes: list[str]) -> dict[str, int]:
    """Each scope's keys: its key index's size (ZCARD, as state::list-indexes counts a
    scope's keys; an expired key counts until the reaper removes it), in one pipeline."""
    replies = await state.conn.pipeline([["ZCARD", state.keys.for_scope(scope).key_index(scope)]
                                         for scope in scopes])
    return {scope: int(reply) for scope, reply in zip(scopes, replies, strict=True)
            if isinstance(reply, int)}
