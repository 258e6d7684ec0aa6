"""What `stateworker status` (and the console, and /metrics) shows of the dispatch: triggers,
replicas, per-partition lease holder, position, lag (events and ms), events the cap cut, the
dispatchers' counters; each trigger with its partitions' lag (from its mark where it is set
aside: reactive/aside.py), its handler calls and its last condition error (`trigger_status`)."""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker.clock import now_ms
from stateworker.events.model import revision_of
from stateworker.keys import KeySpace
from stateworker.reactive.trimming import StreamInfo, parse_mark
from stateworker.state.reactive.triggers import decode_trigger, live
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import Arg


async def dispatch_status(conn: RedisConnection, keys: KeySpace) -> dict[str, Any]:
    now = now_ms()
    triggers, replicas, counters = await conn.pipeline([
        ["HLEN", keys.triggers],
        ["ZRANGE", keys.replicas, 0, -1, "WITHSCORES"],
        ["HGETALL", keys.dispatch_stats],
    ])
    partitions = []
    for n in range(keys.partitions):
        partitions.append(await _partition(conn, keys, n, now))
    return {
        "triggers": int(triggers),
        "replicas": {r.decode(): {"last_beat_ms_ago": now - int(float(beat))}
                     for r, beat in zip(replicas[::2], replicas[1::2], strict=True)},
        "partitions": partitions,
        "counters": {k.decode(): int(v) for k, v in zip(counters[::2], counters[1::2],
                                                        strict=True)},
    }


async def _partition(conn: RedisConnection, keys: KeySpace, n: int, now: int) -> dict[str, Any]:
    part = keys.partition(n)
    holder, position, cut, info, marks = await conn.pipeline([
        ["GET", part.lease],
        ["HMGET", part.dispatched, "id", "n"],
        ["HMGET", part.cut, "events", "first_kept"],
        ["XINFO", "STREAM", part.events],
        ["HGETALL", part.aside],
    ])
    stream = StreamInfo(info)
    report: dict[str, Any] = {"partition": n, "holder": holder.decode() if holder else None,
                              "events_kept": stream.length}
    report.update(await lag(conn, part.events, stream, position, now))
    if cut[0] is not None:
        report["cut_events"] = int(cut[0])
        report["cut_first_kept"] = cut[1].decode() if cut[1] else None
    if marks:  # (the set-aside triggers: where each stands, events it has not been handed)
        report["aside"] = {}
        for field, value in zip(marks[::2], marks[1::2], strict=True):
            mark = parse_mark(value)
            report["aside"][field.decode()] = {
                "position": mark.id, "lag_events": max(0, stream.added - mark.n)}
    return report


async def lag(conn: RedisConnection, events: str, stream: StreamInfo, position: list[Any],
              now: int) -> dict[str, Any]:
    """A follower's position (HMGET id n) behind its stream: events, and the age in ms of
    the first event it has not passed (the dispatcher's and the snapshot's alike). Once the
    hard cap has cut that event: the age of the last event passed, which it is no older than
    (with none passed yet, of the oldest kept). Measured from the oldest kept, younger than
    the one lacked, the lag would go backwards while nothing is passed."""
    if position[0] is None:
        return {"position": None, "lag_events": stream.length, "lag_ms": None}
    behind = max(0, stream.added - int(position[1]))
    report: dict[str, Any] = {"position": position[0].decode(), "lag_events": behind, "lag_ms": 0}
    if behind:
        # The stream looked at after the read: not cut past the position then, not before.
        after, info = await conn.pipeline([
            ["XRANGE", events, "(" + position[0].decode(), "+", "COUNT", 1],
            ["XINFO", "STREAM", events]])
        passed_ms = revision_of(position[0])[0]
        if StreamInfo(info).deleted > int(position[1]) and passed_ms:
            report["lag_ms"] = max(0, now - passed_ms)
        elif after:
            report["lag_ms"] = max(0, now - revision_of(after[0][0])[0])
    return report


# The dispatchers' counters (`Counts.add`'s names), each with what it counts.
COUNTERS = {
    "handler_calls": "Handler calls handed on to the triggers' target streams.",
    "append_errors": "Handler calls whose append to a target stream failed.",
    "condition_skips": "Handler calls a trigger's condition skipped.",
    "condition_errors": "Trigger conditions that failed (an error or a timeout): skipped.",
    "malformed_events": "Entries of the events streams that are not change events: skipped.",
    "backlog_waits": "Times triggers were set aside at, or caught up to, a full target stream.",
}


class Counts:
    """A dispatcher's counters (handler calls, condition skips and errors, malformed events,
    append errors), added up in memory and flushed into `keys.dispatch_stats` once a round:
    `dispatch_status` shows their sums over every replica. Per trigger (`keys.
    dispatch_by_trigger`): the handler calls it was handed on with, its last condition error."""

    def __init__(self, conn: RedisConnection, key: str, per_trigger: str) -> None:
        self.conn = conn
        self.key = key
        self.per_trigger = per_trigger
        self.pending: dict[str, int] = {}
        self.delivered: dict[str, int] = {}  # trigger id -> handler calls since the flush
        self.errors: dict[str, bytes] = {}  # trigger id -> its last error (JSON)
        self.full: dict[str, bytes] = {}  # trigger id -> the full target it waits on (JSON)
        self.flowing: set[str] = set()  # trigger ids handed on since their last wait

    def add(self, name: str, by: int = 1) -> None:
        if by:
            self.pending[name] = self.pending.get(name, 0) + by

    def handed_on(self, trigger_id: str) -> None:
        self.delivered[trigger_id] = self.delivered.get(trigger_id, 0) + 1
        self.full.pop(trigger_id, None)
        self.flowing.add(trigger_id)

    def failed(self, trigger_id: str, error: dict[str, Any]) -> None:
        self.errors[trigger_id] = msgspec.json.encode(error)

    def waiting(self, trigger_id: str, stream: str, length: int) -> None:
        """The trigger's target stream is full (the backlog): its deliveries wait."""
        self.full[trigger_id] = msgspec.json.encode(
            {"stream": stream, "length": length, "since_ms": now_ms()})
        self.flowing.discard(trigger_id)

    async def flush(self) -> None:
        counts, self.pending = self.pending, {}
        delivered, self.delivered = self.delivered, {}
        errors, self.errors = self.errors, {}
        full, self.full = self.full, {}
        flowing, self.flowing = self.flowing, set()
        commands: list[list[Arg]] = [["HINCRBY", self.key, name, by]
                                     for name, by in counts.items()]
        commands += [["HINCRBY", self.per_trigger, f"{t}|delivered", n]
                     for t, n in delivered.items()]
        if flowing:  # (delivering again since their last wait)
            commands.append(["HDEL", self.per_trigger, *(f"{t}|waiting" for t in sorted(flowing))])
        for name, marks in (("error", errors), ("waiting", full)):
            if marks:
                commands.append(["HSET", self.per_trigger,
                                 *(x for t, e in marks.items() for x in (f"{t}|{name}", e))])
        if commands:
            await self.conn.pipeline(commands)

    async def forget(self, gone: list[str]) -> None:
        """Drop the fields of the triggers `gone` (unregistered, reaped), and what is
        unflushed of them (else the next flush writes them back)."""
        for trigger_id in gone:
            for unflushed in (self.delivered, self.errors, self.full):
                unflushed.pop(trigger_id, None)
            self.flowing.discard(trigger_id)
        if gone:
            await self.conn.execute("HDEL", self.per_trigger,
                                    *(f"{t}|{what}" for t in gone for what in FIGURES))

    async def prune(self, live: set[str]) -> None:
        """Drop the fields of triggers no longer registered (after a reload of them)."""
        # (HGETALL, not HKEYS: a command the service's ACL rule has already)
        flat = await self.conn.execute("HGETALL", self.per_trigger)
        gone = [f for f in flat[::2] if f.decode(errors="replace").rpartition("|")[0] not in live]
        if gone:
            await self.conn.execute("HDEL", self.per_trigger, *gone)


FIGURES = ("delivered", "error", "waiting", "cut")


async def trigger_figures(conn: RedisConnection, keys: KeySpace, ids: list[str]
                          ) -> list[tuple[int, dict[str, Any] | None, dict[str, Any] | None, int]]:
    """Each trigger's handler calls handed on (every replica's), last error, the full
    target stream its deliveries wait on (None: none) and the events the cap cut before they
    were handed on to it while it was set aside."""
    if not ids:
        return []
    flat = await conn.execute("HMGET", keys.dispatch_by_trigger,
                              *(f"{t}|{what}" for t in ids for what in FIGURES))
    n = len(FIGURES)

    def mark(raw: bytes | None) -> dict[str, Any] | None:
        return None if raw is None else msgspec.json.decode(raw)

    return [(int(flat[n * i] or 0), mark(flat[n * i + 1]), mark(flat[n * i + 2]),
             int(flat[n * i + 3] or 0)) for i in range(len(ids))]


async def trigger_status(conn: RedisConnection, keys: KeySpace, partitions: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Each live trigger with the dispatch's lag on the partitions it reads (its scope's, or
    every one): events not yet handed on, and the age of the oldest (None: no dispatcher
    has passed one of its events yet); the handler calls it was handed on with (every
    replica's, since it was registered), its last condition error (None), the full target
    stream its deliveries wait on (`waiting_on`: stream, length, since_ms; None), where it is
    set aside (`aside`: partition, position, lag_events each; None) and the events the cap
    cut before it was handed them there (`cut_events`)."""
    by_partition = {p["partition"]: p for p in partitions}
    flat = await conn.execute("HGETALL", keys.triggers)
    now = now_ms()
    listed = []
    for trigger in sorted((t for t in map(decode_trigger, flat[1::2]) if live(t, now)),
                          key=lambda t: t.id.encode()):
        scope = trigger.config.scope
        parts = [keys.partition_of(scope)] if scope is not None else range(keys.partitions)
        behind = [by_partition[n] for n in parts if n in by_partition]
        ages = [p["lag_ms"] for p in behind if p.get("lag_ms") is not None]
        aside = [{"partition": p["partition"], **p["aside"][trigger.id]} for p in behind
                 if trigger.id in p.get("aside", {})]
        lags = {p["partition"]: p["lag_events"] for p in behind}
        lags.update((a["partition"], a["lag_events"]) for a in aside)
        listed.append({"id": trigger.id, "function_id": trigger.function_id,
                       "service": trigger.service, "scope": scope, "owner": trigger.owner,
                       "lag_events": sum(lags.values()),
                       "lag_ms": max(ages) if ages else None, "aside": aside or None})
    figures = await trigger_figures(conn, keys, [t["id"] for t in listed])
    for row, (delivered, error, waiting, cut) in zip(listed, figures, strict=True):
        row.update(delivered=delivered, last_error=error, waiting_on=waiting, cut_events=cut)
    return listed
