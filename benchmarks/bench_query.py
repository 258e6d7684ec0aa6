"""The query part of `stateworker bench`: an indexed `eq` query on a 100,000-entry scope beside
the same query unindexed (issue 23's target: >= 50x), and what an index costs a write.

One scope of ENTRIES entries `{"kind": i % 1000, "plain": i % 1000, "n": i}`; `/kind` is
indexed, `/plain` (the same values) is not, so both queries read the same data and find the
same 100 entries. A query is every page until `next_after` is gone; the two are timed in
alternation, round after round, and the medians compared. Writes: `state::set` at 64 in
flight on a scope without indexes beside one with an index on `/kind` (paired the same way).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import anyio
import msgspec

from benchmarks.benchtime import timed
from stateworker.state.api import StateStore

ENTRIES = 100_000
SCOPE = "bench-query"
TARGET = 50.0  # indexed / unindexed, issue 23


async def _fill(store: StateStore, out: Any) -> None:
    print(f"filling a scope with {ENTRIES:,} entries ...", file=out, flush=True)

    async def writer(start: int) -> None:
        for i in range(start, ENTRIES, 64):
            await store.call_json("state::set", b'{"scope":"%s","key":"k%06d","value":'
                                  b'{"kind":%d,"plain":%d,"n":%d}}'
                                  % (SCOPE.encode(), i, i % 1000, i % 1000, i))

    async with anyio.create_task_group() as tg:
        for start in range(64):
            tg.start_soon(writer, start)


async def _query(store: StateStore, pointer: str) -> tuple[float, int, str | None]:
    """Seconds for every page of `pointer` eq 7, the entries found, the index walked."""
    started = time.perf_counter()
    found, used, after = 0, None, None
    while True:
        body: dict[str, Any] = {"scope": SCOPE, "limit": 1000,
                                "where": [{"pointer": pointer, "op": "eq", "value": 7}]}
        if after is not None:
            body["after"] = after
        page = msgspec.json.decode(await store.call_json("state::query",
                                                         msgspec.json.encode(body)))
        found += len(page["entries"])
        used = page.get("index", used)
        after = page.get("next_after")
        if after is None:
            return time.perf_counter() - started, found, used


async def query_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    async with StateStore.open(url, prefix="benchq", reaper=False) as store:
        await _fill(store, out)
        started = time.perf_counter()
        created = await store.call("state::create-index", {"scope": SCOPE, "pointer": "/kind"})
        while created["building"]:
            created = await store.call("state::create-index", {"scope": SCOPE,
                                                               "pointer": "/kind"})
        build_s = time.perf_counter() - started
        indexed, plain = [], []
        for _ in range(max(rounds, 3)):
            s, found, used = await _query(store, "/kind")
            assert found == ENTRIES // 1000 and used == "/kind", (found, used)
            indexed.append(s)
            s, found, used = await _query(store, "/plain")
            assert found == ENTRIES // 1000 and used is None, (found, used)
            plain.append(s)
        ratio = statistics.median(plain) / statistics.median(indexed)
        print(f"{'state::query eq, ' + format(ENTRIES, ',') + ' entries':<34}"
              f"{'indexed ms':>12}{'unindexed ms':>14}{'ratio':>8}", file=out)
        print(f"{'(100 matches, every page)':<34}{statistics.median(indexed) * 1000:>12.2f}"
              f"{statistics.median(plain) * 1000:>14.1f}{ratio:>8.1f}  (target >= {TARGET:g})",
              file=out)
        print(f"index build over {ENTRIES:,} entries: {build_s:.2f} s", file=out)

        value = b'{"kind":7,"plain":7,"n":1}'

        def setter(scope: bytes) -> Any:
            async def op(w: int, i: int) -> Any:
                return await store.call_json(
                    "state::set", b'{"scope":"%s","key":"w%d","value":%s}' % (scope, w, value))
            return op

        await store.call("state::create-index", {"scope": "bench-q-indexed", "pointer": "/kind"})
        bare, kept = [], []
        for _ in range(rounds):
            bare.append((await timed(setter(b"bench-q-bare"), 64, seconds))[0])
            kept.append((await timed(setter(b"bench-q-indexed"), 64, seconds))[0])
        write_ratio = statistics.median(kept) / statistics.median(bare)
        print(f"state::set at 64, no index {statistics.median(bare):,.0f} ops/s, one index "
              f"{statistics.median(kept):,.0f} ops/s: {write_ratio:.2f}", file=out)
    return {"entries": ENTRIES, "indexed_ms": round(statistics.median(indexed) * 1000, 3),
            "unindexed_ms": round(statistics.median(plain) * 1000, 1),
            "ratio": round(ratio, 1), "target": TARGET, "build_s": round(build_s, 2),
            "set_no_index": round(statistics.median(bare)),
            "set_one_index": round(statistics.median(kept)), "set_ratio": round(write_ratio, 3)}
