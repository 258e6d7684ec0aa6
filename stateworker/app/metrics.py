"""`/metrics` of the HTTP face (app/http.py), in Prometheus's text format, from the official
client library (`prometheus_client`).

The bus's figures are the runtime's own counters (bus/stats.py: kept in process on the hot
path, read here at scrape time, so serving metrics costs a call nothing), the HTTP face's a
`Stats` of its own, counted the same way; the streams' lag and pending, and whether Redis
answers, are read from Redis when scraped (an XINFO GROUPS and at most one more read per
stream, one PING). Each service has a registry of its own (two
services in one process, as the tests run them, never share a counter).

    stateworker_bus_calls_total{function,code}      calls answered over the bus
    stateworker_bus_call_seconds{function}          their latency (histogram)
    stateworker_bus_pending{service,shard,principal}
                                                    entries read, not yet acknowledged, of
    stateworker_bus_lag_entries{...}                the service's streams and of every trigger
    stateworker_bus_lag_seconds{...}                target's; entries not yet read; the age
                                                    of the oldest entry of either kind
    stateworker_bus_read_ahead                      entries read ahead of the call slots, in
    stateworker_bus_callers_waiting                 the callers' lanes (bus/lanes.py), and
                                                    how many callers they are
    stateworker_http_calls_total{function,code}     calls through POST /v1/call
    stateworker_http_call_seconds{function}         their latency (histogram)
    stateworker_redis_up                            1 when Redis answered a PING (1 s)
    stateworker_bus_redis_up                        the same of the bus's own Redis (only
                                                    with STATEWORKER_BUS_REDIS_URL)
    stateworker_triggers                            triggers registered
    stateworker_dispatch_<counter>_total            the dispatch's counters (all replicas;
                                                    reactive/status.py COUNTERS)
    stateworker_dispatch_lag_events{partition}      events not yet handed on, and the age
    stateworker_dispatch_lag_seconds{partition}     of the oldest of them
    stateworker_snapshot_lag_events{partition}      the same for the snapshot in PostgreSQL
    stateworker_snapshot_lag_seconds{partition}     (when one runs for the prefix)
    stateworker_trigger_lag_events{trigger}         per trigger: its partitions' lag,
    stateworker_trigger_lag_seconds{trigger}        and the handler calls it was handed on
    stateworker_trigger_calls_total{trigger}        with (every replica's)
    stateworker_trigger_waiting{trigger}            1 while its target's stream is full (the
                                                    backlog: its deliveries wait)
    stateworker_dedupe_records                      bus call ids held for the dedupe window
    stateworker_console_tails                       live tails open (STATEWORKER_MAX_TAILS)
    stateworker_console_tails_refused_total         tails refused at a cap (507)
    stateworker_http_connections                    the HTTP face's connections open
                                                    (STATEWORKER_HTTP_MAX_CONNECTIONS)
    stateworker_http_connections_refused_total      connections refused at a cap (503)
    stateworker_build_info{version,python}          1
    process_*, python_info                          the client's process and platform
                                                    collectors

A `function` label is one of the functions the service serves, or `other` for every other
name (bus/stats.py: callers choose the names, a label each would grow without limit).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
from prometheus_client import (
    CollectorRegistry,
    Gauge,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from stateworker.app.cli.parser import version
from stateworker.app.console import Tails
from stateworker.app.http_admission import Admission
from stateworker.bus.runtime import BusRuntime
from stateworker.bus.stats import LATENCY_BUCKETS_MS, OTHER_FUNCTION, Stats, stream_backlog
from stateworker.clock import now_ms
from stateworker.keys import CALL_BUCKETS, bus_shard_stream
from stateworker.reactive.status import COUNTERS, dispatch_status, trigger_status
from stateworker.scripts.bindings import RECORD_SLICES, slice_ms
from stateworker.snapshot.status import snapshot_status
from stateworker.state.core.store import RedisState
from stateworker.transport.retry import ping_trouble
from stateworker.transport.wire import ConnectionLost, ReplyError

_BOUNDS_S = [bound / 1000 for bound in LATENCY_BUCKETS_MS]
_BOUNDS = [*map(str, _BOUNDS_S), "+Inf"]
_STREAM_LABELS = ["service", "shard", "principal"]


class _Scraped(Collector):
    """What one scrape read: the bus's counters and what Redis said (set by `Metrics`)."""

    def __init__(self) -> None:
        self.families: list[Any] = []

    def collect(self) -> Iterator[Any]:
        yield from self.families


class Metrics:
    """The metrics of one service: `http_call` counts the HTTP face's calls, `exposition`
    renders everything in the text format."""

    def __init__(self, state: RedisState, runtime: BusRuntime, tails: Tails,
                 admission: Admission) -> None:
        self.state = state
        self.runtime = runtime
        self.tails = tails
        self.admission = admission
        self.registry = CollectorRegistry(auto_describe=True)
        # The HTTP face's calls, counted as the bus counts its own (plain integers on the
        # hot path, read at the scrape): the client's Counter and Histogram took 6 us a call.
        self.http = Stats(fn for fn in runtime.stats.codes if fn != OTHER_FUNCTION)
        Gauge("stateworker_build_info", "1, labelled with the version of stateworker and of "
              "Python running it.", ["version", "python"], registry=self.registry).labels(
            version(), platform.python_version()).set(1)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.scraped = _Scraped()
        self.registry.register(self.scraped)
        self.lock = anyio.Lock()

    def http_call(self, fn: str, code: str, started: float) -> None:
        """One call of the HTTP face answered with `code` ("OK": a success), begun at
        `started` (time.perf_counter())."""
        self.http.count(None if code == "OK" else code, started, fn)

    async def exposition(self) -> tuple[bytes, str]:
        """The text format, and its content type."""
        async with self.lock:  # (one scrape's figures at a time in `scraped`)
            self.scraped.families = [*self._bus(), *await self._redis()]
            return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _bus(self) -> list[Any]:
        lanes = self.runtime.lanes
        ahead = GaugeMetricFamily("stateworker_bus_read_ahead",
                                  "Bus entries read ahead of the call slots (the lanes).")
        ahead.add_metric([], lanes.held + lanes.parked)
        waiting = GaugeMetricFamily("stateworker_bus_callers_waiting",
                                    "Callers with entries read ahead (one lane each).")
        waiting.add_metric([], len(lanes.lanes))
        tails = GaugeMetricFamily("stateworker_console_tails", "Console live tails open.")
        tails.add_metric([], sum(self.tails.open.values()))
        refused = CounterMetricFamily("stateworker_console_tails_refused",
                                      "Console live tails refused at a cap (507).")
        refused.add_metric([], self.tails.refused)
        conns = GaugeMetricFamily("stateworker_http_connections",
                                  "The HTTP face's connections open.")
        conns.add_metric([], self.admission.total)
        turned = CounterMetricFamily("stateworker_http_connections_refused",
                                     "HTTP connections refused at a cap (503).")
        turned.add_metric([], self.admission.refused)
        return [*_calls(self.runtime.stats, "bus", "answered over the bus"),
                *_calls(self.http, "http", "through the HTTP face"),
                ahead, waiting, tails, refused, conns, turned]

    async def _redis(self) -> list[Any]:
        up = GaugeMetricFamily("stateworker_redis_up", "1 when Redis answered a PING.")
        ups = [up]
        bus_down = False
        if self.state.split_bus:
            bus_up = GaugeMetricFamily("stateworker_bus_redis_up",
                                       "1 when the bus's own Redis answered a PING.")
            bus_down = await ping_trouble(self.state.bus_conn) is not None
            bus_up.add_metric([], 0 if bus_down else 1)
            ups.append(bus_up)
        up.add_metric([], 0 if await ping_trouble(self.state.conn) else 1)
        if not up.samples[0].value:
            return ups
        lost = GaugeMetricFamily("stateworker_store_lost", "1 while writes are refused because "
                                 "Redis lost data that PostgreSQL holds (STORE_LOST).")
        lost.add_metric([], 0 if self.state.lost is None else 1)
        try:
            with anyio.fail_after(5.0):
                followers, targets = await self._followers()
                # (a bus Redis that did not answer is not asked again: the state's figures
                # come at once rather than after the wait for it)
                streams = [] if bus_down else await self._streams(targets)
        except (TimeoutError, ConnectionLost, ReplyError):
            return [*ups, lost]  # (Redis went away or slowed meanwhile: the next scrape says so)
        return [*ups, lost, *streams, *followers]

    async def _streams(self, targets: Iterable[str]) -> list[Any]:
        """The backlog of every stream the service reads and every trigger target's (each
        shard of each): entries read and not acknowledged, entries not read, the age of the
        oldest of them (a stream no group of its service reads yet: left out)."""
        pending = GaugeMetricFamily("stateworker_bus_pending", "Bus entries read and not yet "
                                    "acknowledged.", labels=_STREAM_LABELS)
        lag = GaugeMetricFamily("stateworker_bus_lag_entries", "Bus entries not yet read.",
                                labels=_STREAM_LABELS)
        age = GaugeMetricFamily("stateworker_bus_lag_seconds", "Age of the oldest bus entry "
                                "not yet read or not yet acknowledged.", labels=_STREAM_LABELS)
        now = now_ms()
        for labels, stream, group in self._stream_names(targets):
            backlog = await stream_backlog(self.state.bus_conn, stream, group)
            if backlog is None:
                continue
            pending.add_metric(labels, backlog.pending)
            if backlog.lag is not None:  # (Redis cannot tell after entries were deleted)
                lag.add_metric(labels, backlog.lag)
            age.add_metric(labels, 0 if backlog.oldest_ms is None
                           else max(0, now - backlog.oldest_ms) / 1000)
        return [pending, lag, age]

    def _stream_names(self, targets: Iterable[str]) -> list[tuple[list[str], str, str]]:
        """Each stream's labels (service, shard, principal), name and group: the service's
        own shards (and in `acl` mode each principal's stream), every shard of every other
        service a trigger calls."""
        bus, sources = self.runtime.bus, self.runtime.sources
        names = [([bus.service, str(shard), ""], source.stream, bus.group)
                 for shard, source in enumerate(sources.shards)]
        names += [([bus.service, "0", source.principal], source.stream, bus.group)
                  for source in list(sources.by_stream.values())  # (acl mode changes it)
                  if source.principal is not None]
        settings = self.state.settings
        for service in sorted(set(targets) - {bus.service}):
            names += [([service, str(shard), ""],
                       bus_shard_stream(settings.prefix, service, shard), service)
                      for shard in range(settings.bus_shards)]
        return names

    async def _followers(self) -> tuple[list[Any], set[str]]:
        """The dispatch's and the snapshot's lag per partition, as `status` reports them
        (reactive/status.py, snapshot/status.py), and the dispatch's counters; and the
        services the triggers call."""
        conn, keys = self.state.conn, self.state.keys
        dispatch = await dispatch_status(conn, keys)
        triggers = GaugeMetricFamily("stateworker_triggers", "Triggers registered.")
        triggers.add_metric([], dispatch["triggers"])
        counters = []
        for name, meaning in COUNTERS.items():
            counter = CounterMetricFamily(f"stateworker_dispatch_{name}",
                                          f"{meaning} Every replica's.")
            counter.add_metric([], dispatch["counters"].get(name, 0))
            counters.append(counter)
        per_trigger = await trigger_status(conn, keys, dispatch["partitions"])
        families = [triggers, *counters, *_lags("dispatch", dispatch["partitions"]),
                    *_per_trigger(per_trigger), await self._dedupe()]
        snapshot = await snapshot_status(conn, keys)
        if snapshot is not None:
            families += _lags("snapshot", snapshot["partitions"])
        return families, {trigger["service"] for trigger in per_trigger}

    async def _dedupe(self) -> GaugeMetricFamily:
        """The call ids held for the dedupe window: the fields of every slice that can still
        be live (RECORD_SLICES back, one ahead: records.lua's) of every bucket (on a cluster,
        of every partition's records: each id at its home, and a record kept away from its
        id's home once more), one pipeline."""
        keys, settings = self.state.keys, self.state.settings
        now = now_ms() // slice_ms(settings)
        slices = range(now - RECORD_SLICES, now + 2)
        names = [part.call_records(s) for part in keys.all_partitions() for s in slices] \
            if self.state.cluster else \
            [keys.call_ids(bytes([bucket]), s) for bucket in range(CALL_BUCKETS) for s in slices]
        sizes = await self.state.conn.pipeline([["HLEN", name] for name in names])
        records = GaugeMetricFamily("stateworker_dedupe_records",
                                    "Bus call ids held for the dedupe window.")
        # (each slice's hash holds a mark besides its records: records.lua, RECORDS_MARK)
        records.add_metric([], sum(max(0, int(size) - 1) for size in sizes))
        return records


def _per_trigger(triggers: list[dict[str, Any]]) -> list[Any]:
    """Each trigger's lag (its partitions': events, seconds) and handler calls handed on."""
    events = GaugeMetricFamily("stateworker_trigger_lag_events",
                               "Events of the trigger's partitions not handed on yet.",
                               labels=["trigger"])
    seconds = GaugeMetricFamily("stateworker_trigger_lag_seconds",
                                "Age of the oldest of them.", labels=["trigger"])
    calls = CounterMetricFamily("stateworker_trigger_calls", "Handler calls the trigger was "
                                "handed on with, every replica's.", labels=["trigger"])
    waiting = GaugeMetricFamily("stateworker_trigger_waiting", "1 while the trigger's target "
                                "stream is full (STATEWORKER_TRIGGER_BACKLOG): its deliveries "
                                "wait.", labels=["trigger"])
    for trigger in triggers:
        label = [trigger["id"]]
        events.add_metric(label, trigger["lag_events"])
        if trigger["lag_ms"] is not None:
            seconds.add_metric(label, trigger["lag_ms"] / 1000)
        calls.add_metric(label, trigger["delivered"])
        waiting.add_metric(label, 0 if trigger["waiting_on"] is None else 1)
    return [events, seconds, calls, waiting]


def _lags(what: str, partitions: list[dict[str, Any]]) -> list[Any]:
    """`stateworker_<what>_lag_events` and `_lag_seconds` per partition."""
    events = GaugeMetricFamily(f"stateworker_{what}_lag_events",
                               f"Events the {what} has not passed yet.", labels=["partition"])
    seconds = GaugeMetricFamily(f"stateworker_{what}_lag_seconds",
                                f"Age of the oldest event the {what} has not passed.",
                                labels=["partition"])
    for row in partitions:
        label = [str(row["partition"])]
        events.add_metric(label, row["lag_events"])
        if row["lag_ms"] is not None:
            seconds.add_metric(label, row["lag_ms"] / 1000)
    return [events, seconds]


def _calls(stats: Stats, door: str, what: str) -> list[Any]:
    """`stateworker_<door>_calls_total{function,code}` and `_call_seconds{function}` (a
    histogram for each function called) of `stats`."""
    calls = CounterMetricFamily(f"stateworker_{door}_calls", f"Calls {what}.",
                                labels=["function", "code"])
    latency = HistogramMetricFamily(f"stateworker_{door}_call_seconds", f"Latency of calls {what}.",
                                    labels=["function"])
    for fn, codes in sorted(stats.codes.items()):
        for code, count in sorted(codes.items()):
            calls.add_metric([fn, code], count)
        *counts, sum_us = stats.latencies[fn]
        if any(counts):  # (the functions called: a histogram each)
            cumulative = [sum(counts[:n + 1]) for n in range(len(counts))]
            latency.add_metric([fn], list(zip(_BOUNDS, cumulative, strict=True)), sum_us / 1e6)
    return [calls, latency]
