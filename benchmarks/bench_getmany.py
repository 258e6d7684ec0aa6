"""The get-many part of `stateworker bench`: one `state::get-many` of KEYS keys against KEYS
`state::get` calls for the same keys (bench_batched.py: over the bus and in process, the gets
in turn and at once), as ratios measured in the same run."""

from __future__ import annotations

from typing import Any

from benchmarks.bench_batched import Call, Op, batch_vs_singles, report, ways
from stateworker.state.api import StateStore

PREFIX = "benchgm"
KEYS = 100
SCOPE = "bench-getmany"
TARGET = 10.0  # get-many / sequential gets (issue 23)


def _ops(call: Call) -> dict[str, Op]:
    keys = [f"k{i:03d}" for i in range(KEYS)]
    many = b'{"scope":"%s","keys":[%s]}' % (SCOPE.encode(),
                                             b",".join(b'"%s"' % k.encode() for k in keys))
    singles = [b'{"scope":"%s","key":"%s"}' % (SCOPE.encode(), k.encode()) for k in keys]
    return ways(call, "state::get-many", many, "state::get", singles)


async def _prepare(store: StateStore) -> None:
    for i in range(KEYS):
        await store.set(SCOPE, f"k{i:03d}", {"n": i, "name": "bench", "ok": True})


async def getmany_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    faces = await batch_vs_singles(url, PREFIX, "state::get-many", _ops, _prepare, seconds,
                                   rounds)
    report(out, f"get-many of {KEYS} keys vs {KEYS} gets", faces, ("many/s", "gets/s"), TARGET,
           f"a rate is batches of {KEYS} keys read per second by one caller; gets at once: "
           f"{KEYS} gets in flight together (pipelined)")
    return {"keys": KEYS, "target": TARGET, "faces": faces}
