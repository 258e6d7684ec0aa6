"""Issue 24's harness, "the bus at its floor" (`scripts/bench --sections floor`): every "Must
show" ratio of the issue measured as the bus stands, one table: ours, the reference, the ratio
and the issue's target. Each pair is measured in the same run, in alternation (medians of the
rounds), so the load of this shared machine hits both sides alike.

1. bus `state::set`, 64 in flight, vs in-process `StateStore.set` and vs a plain redis-py
   worker (`benchmarks/plain_worker.py`, its own process) called by the same `StateClient`;
2. one call at a time, interleaved (bus call, raw call, ...): bus p50 vs one raw EVALSHA;
3. CPU per call at 64 in flight of the `stateworker serve` process vs the plain worker's
   (utime + stime from /proc/<pid>/stat around each measurement);
4. bus `set` with 10 triggers registered (each matching one of the 10 scopes written, calls
   delivered to a stream nobody reads; a second service on its own prefix) vs none; write ->
   handler start p99 at 1,000 events/s with those 10 triggers registered (bench_reactive's);
5. `strict` (appendfsync always) bus `set` at 64 vs etcd puts at 64 (Debian's etcd-server,
   data in the same temporary directory as Redis's, aetcd); fsyncs per call counted with
   strace on redis-server; strict `get` vs fast `get`, one at a time;
6. Redis memory per entry (less the event stream) vs a plain SET of the same value, on a
   redis-server with default settings, for 100,000 entries of 200 B and of 2 KiB, where the
   bytes go (MEMORY USAGE per key kind, OBJECT ENCODING), the events' bytes per partition;
7. 1 and 3 again on a 3+3 Redis Cluster (tests/cluster.py; the service with 3 bus shards),
   as a second table.

Without etcd or aetcd the etcd lines say so and the rest runs. What each line measures, and
what the figures decided: docs/decisions/0022-the-bus-cost-floor.md.

This module makes the table; each floor is measured by a module of its own: floor_bus.py (1 to 4
and 7), floor_strict.py (5), floor_memory.py (6), on the shared parts of floor_process.py (the
processes, their CPU, the sides in alternation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.floor_bus import bus_lines, cluster_lines
from benchmarks.floor_memory import memory_lines
from benchmarks.floor_strict import strict_lines


def _line(out: Any, rows: list[dict[str, Any]], measure: str, ours: float, ref: float | None,
          reference: str, target: str, fmt: str = ",.0f", ratio: float | None = None,
          note: str = "") -> None:
    if ratio is None and ref:
        ratio = ours / ref
    row = {"measure": measure, "ours": ours, "reference": reference, "ref": ref,
           "ratio": None if ratio is None else round(ratio, 3), "target": target}
    if note:
        row["note"] = note
    rows.append(row)
    ref_text = "-" if ref is None else format(ref, fmt)
    ratio_text = "-" if ratio is None else f"{ratio:.2f}"
    print(f"{measure:<44}{format(ours, fmt):>10}  {reference:<34}{ref_text:>10}"
          f"{ratio_text:>7}  {target}{('  ' + note) if note else ''}", file=out)


async def floor_section(url: str, socket_path: str, seconds: float, rounds: int, out: Any,
                        cluster: bool = True) -> dict[str, Any]:
    figures: dict[str, Any] = {"uptime": Path("/proc/loadavg").read_text().strip()}
    figures["bus"] = await bus_lines(url, socket_path, seconds, rounds)
    figures["strict"] = await strict_lines(seconds, rounds)
    figures["memory"] = await memory_lines()
    if cluster:
        figures["cluster"] = await cluster_lines(seconds, rounds)
    rows: list[dict[str, Any]] = []
    figures["rows"] = rows
    bus, strict = figures["bus"], figures["strict"]
    rate, cpu, one = bus["set_64_ops_per_s"], bus["cpu_us_per_call_64"], bus["one_at_a_time"]
    print(f"\n{'floor (issue 24)':<44}{'ours':>10}  {'reference':<34}{'ref':>10}{'ratio':>7}"
          f"  target", file=out)
    _line(out, rows, "1 bus set/s, 64 in flight", rate["bus"], rate["store"],
          "StateStore.set/s in process, 64", ">= 0.6")
    _line(out, rows, "1 bus set/s, 64 in flight", rate["bus"], rate["plain"],
          "plain redis-py worker/s, 64", ">= 1.5")
    _line(out, rows, "2 bus set p50 ms, one at a time", one["bus_p50_ms"],
          one["raw_evalsha_p50_ms"], "raw EVALSHA p50 ms, interleaved", "<= 2.5", ".3f")
    _line(out, rows, "3 service CPU us/call, 64 in flight", cpu["bus"], cpu["plain"],
          "plain worker's CPU us/call", "<= 0.5", ".1f")
    _line(out, rows, "4 bus set/s, 10 triggers registered", rate["triggers"], rate["bus"],
          "bus set/s, none (another service)", ">= 0.9")
    print("1 CPU us per call at 64 in flight, by process (caller: the bench's client; server: "
          "the service or the plain worker):", file=out)
    for side, parts in bus["budget_us_per_call_64"].items():
        print(f"  {side:<9} caller {parts['caller']:>6.1f}  server {parts['server']:>6.1f}  "
              f"redis {parts['redis']:>6.1f}  total {parts['total']:>6.1f}", file=out)
    latency = bus["handler_latency_10_triggers"]
    _line(out, rows, "4 write -> handler start p99 ms @1000/s", latency["p99_ms"], None,
          f"(p50 {latency['p50_ms']:.3f} ms, {latency['events']}/{latency['of']})",
          "<= 10 ms", ".3f")
    ops, p50 = strict["ops_per_s"], strict["p50_ms"]
    etcd_note = strict.get("etcd", "")
    _line(out, rows, "5 strict bus set/s, 64 in flight", ops["strict_set_64"],
          ops.get("etcd_put_64"), "etcd put/s (aetcd), 64", ">= 1.0", note=etcd_note)
    _line(out, rows, "5 strict bus set p50 ms, one at a time", p50["strict_set_1"],
          p50.get("etcd_put_1"), "etcd put p50 ms, one at a time", "(issue's table)", ".3f")
    for kind in ("set", "get"):
        count = strict.get(f"fsyncs_per_{kind}")
        _line(out, rows, f"5 fsyncs per strict bus {kind} (strace)",
              -1 if count is None else count, None, "fsync+fdatasync of redis-server",
              "<= 2" if kind == "set" else "", ".2f",
              note="" if count is not None else "strace unavailable")
    _line(out, rows, "5 strict bus get/s, one at a time", ops["strict_get_1"], ops["fast_get_1"],
          "fast bus get/s, one at a time", ">= 0.8")
    for case in figures["memory"]["cases"]:
        label = case.get("entries_are", "")
        _line(out, rows, f"6 Redis B/entry, {case['value_bytes']} B value{', ' + label if label else ''}"
              ", no events", case["ours"], case["plain_set"], "plain SET B/key",
              "(stated)" if label else "<= 2x")
    print("6 where the bytes go (MEMORY USAGE, SAMPLES 0), per entry:", file=out)
    for case in figures["memory"]["cases"]:
        idx = case["index_bytes_per_member"]
        label = f" ({case['entries_are']})" if case.get("entries_are") else ""
        print(f"  {case['value_bytes']:>5} B value{label}: entry {case['entry_memory_usage']:.0f}"
              f" ({case['entry_encoding']}), index members k {idx['k']:.0f} u {idx['u']:.0f}"
              f" t {idx['t']:.0f} ttl {idx['ttl']:.0f}, records {case['records_bytes']} B in "
              f"{case['record_keys']} keys, plain SET key {case['plain_set_memory_usage']}; events retained "
              f"{case['events_retained']:,} in {case['events_bytes']:,} B "
              f"({case['event_bytes_each']} B each, one partition); with them "
              f"{case['with_events']:.0f} B/entry", file=out)
    if "cluster" in figures:
        rate, cpu = figures["cluster"]["set_64_ops_per_s"], figures["cluster"]["cpu_us_per_call_64"]
        print(f"\n{'floor on the 3+3 cluster (7)':<44}{'ours':>10}  {'reference':<34}{'ref':>10}"
              f"{'ratio':>7}  target", file=out)
        rows = figures["cluster_rows"] = []
        _line(out, rows, "1 bus set/s, 64 in flight, 3 shards", rate["bus"], rate["store"],
              "StateStore.set/s in process, 64", ">= 0.6")
        _line(out, rows, "1 bus set/s, 64 in flight, 3 shards", rate["bus"], rate["plain"],
              "plain redis-py worker/s, 64", ">= 1.5")
        _line(out, rows, "3 service CPU us/call, 64 in flight", cpu["bus"], cpu["plain"],
              "plain worker's CPU us/call", "<= 0.5", ".1f")
    print(f"load (/proc/loadavg at start): {figures['uptime']}", file=out)
    return figures
