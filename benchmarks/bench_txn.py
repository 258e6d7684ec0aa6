"""The transaction part of `stateworker bench`: one `state::transaction` of OPS `set` ops
against OPS `state::set` calls of the same keys and values (bench_batched.py: over the bus and
in process, the sets in turn and at once), as ratios measured in the same run. A transaction
writes all or nothing, which neither way of the sets does; the ratio says what that costs or
saves."""

from __future__ import annotations

from typing import Any

from benchmarks.bench_batched import Call, Op, batch_vs_singles, report, ways
from stateworker.state.api import StateStore

PREFIX = "benchtx"
OPS = 10
SCOPE = "bench-txn"
TARGET = 2.0  # a 10-op transaction / 10 sets one after another (issue 23)
VALUE = b'{"n":1,"name":"bench","ok":true}'


def _ops(call: Call) -> dict[str, Op]:
    keys = [f"k{i:02d}" for i in range(OPS)]
    transaction = b'{"scope":"%s","ops":[%s]}' % (SCOPE.encode(), b",".join(
        b'{"op":"set","key":"%s","value":%s}' % (k.encode(), VALUE) for k in keys))
    singles = [b'{"scope":"%s","key":"%s","value":%s}' % (SCOPE.encode(), k.encode(), VALUE)
               for k in keys]
    return ways(call, "state::transaction", transaction, "state::set", singles)


async def _nothing(store: StateStore) -> None:
    del store  # (the sets and the transaction write the same keys over and over)


async def txn_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    faces = await batch_vs_singles(url, PREFIX, "state::transaction", _ops, _nothing, seconds,
                                   rounds)
    report(out, f"a {OPS}-op transaction vs {OPS} sets", faces, ("txs/s", "sets/s"), TARGET,
           f"a rate is batches of {OPS} writes per second by one caller; sets at once: {OPS} "
           "sets in flight together (pipelined)")
    return {"ops": OPS, "target": TARGET, "faces": faces}
