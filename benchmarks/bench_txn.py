"""The transaction part of `stateworker bench`: one `state::transaction` of OPS `set` ops
against OPS `state::set` calls of the same keys and values, over the bus (StateClient to a
`stateworker serve`) and in process (StateStore), as ratios measured in the same run.

The sets run two ways, as the get-many section's gets do: one after another (what a loop over
the keys costs, and what a caller needs when each write must follow the last) and all at once
(pipelined). A transaction writes all or nothing, which neither way of the sets does; the
ratio says what that costs or saves. A rate is batches of OPS writes per second, one caller.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from benchmarks.bench_bus import start_service
from benchmarks.bench_getmany import Call, paired
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore

PREFIX = "benchtx"
OPS = 10
SCOPE = "bench-txn"
TARGET = 2.0  # a 10-op transaction / 10 sets one after another (issue 23)
VALUE = b'{"n":1,"name":"bench","ok":true}'


def _ops(call: Call) -> dict[str, Callable[[int, int], Awaitable[Any]]]:
    keys = [f"k{i:02d}" for i in range(OPS)]
    transaction = b'{"scope":"%s","ops":[%s]}' % (SCOPE.encode(), b",".join(
        b'{"op":"set","key":"%s","value":%s}' % (k.encode(), VALUE) for k in keys))
    singles = [b'{"scope":"%s","key":"%s","value":%s}' % (SCOPE.encode(), k.encode(), VALUE)
               for k in keys]

    async def one_transaction(w: int, i: int) -> None:
        await call("state::transaction", transaction)

    async def sets_in_turn(w: int, i: int) -> None:
        for body in singles:
            await call("state::set", body)

    async def sets_at_once(w: int, i: int) -> None:
        async with anyio.create_task_group() as tg:
            for body in singles:
                tg.start_soon(call, "state::set", body)

    return {"transaction": one_transaction, "sets in turn": sets_in_turn,
            "sets at once": sets_at_once}


async def _face(call: Call, seconds: float, rounds: int) -> dict[str, Any]:
    ops = _ops(call)
    row: dict[str, Any] = {}
    for other in ("sets in turn", "sets at once"):
        tx_rate, other_rate = await paired(ops["transaction"], ops[other], seconds, rounds)
        row[other] = {"transactions_per_s": round(tx_rate, 1), "sets_per_s": round(other_rate, 1),
                      "ratio": round(tx_rate / other_rate, 2)}
    return row


async def txn_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIX)) as client, \
                StateStore.open(url, prefix=PREFIX, reaper=False) as store:
            faces = {"bus (StateClient)": await _face(client.call_json, seconds, rounds),
                     "in process (StateStore)": await _face(store.call_json, seconds, rounds)}
    finally:
        service.terminate()
        service.wait(timeout=30)
    print(f"\n{f'a {OPS}-op transaction vs {OPS} sets':<44}{'txs/s':>9}{'sets/s':>9}"
          f"{'ratio':>8}{'target':>8}", file=out)
    for face, row in faces.items():
        for other, figures in row.items():
            target = f"{TARGET:.0f}" if other == "sets in turn" else ""
            print(f"{face + ', ' + other:<44}{figures['transactions_per_s']:>9.1f}"
                  f"{figures['sets_per_s']:>9.1f}{figures['ratio']:>8.2f}{target:>8}", file=out)
    print(f"a rate is batches of {OPS} writes per second by one caller; sets at once: {OPS} sets "
          "in flight together (pipelined)", file=out)
    return {"ops": OPS, "target": TARGET, "faces": faces}
