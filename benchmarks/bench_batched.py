"""What the get-many and transaction sections share: ONE call that does N things against the N
single calls, over the bus (StateClient to a `stateworker serve`) and in process (StateStore),
as ratios measured in the same run.

The single calls run two ways: one after another (a round trip each: what a loop costs, and
what a caller needs when each must follow the last) and all at once (gathered: the bus and the
store pipeline them). Each pair is measured in alternation and the median of the rounds kept,
so drift on this shared machine hits both sides alike. A rate is batches of N per second, one
caller.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import anyio

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore

Call = Callable[[str, bytes], Coroutine[Any, Any, bytes]]  # call_json(fn, body)
Op = Callable[[int, int], Awaitable[Any]]
IN_TURN, AT_ONCE = "in turn", "at once"


def ways(call: Call, fn: str, batch: bytes, single: str,
         singles: Sequence[bytes]) -> dict[str, Op]:
    """The batch call, and the single calls in turn and at once."""
    async def one_call(w: int, i: int) -> None:
        await call(fn, batch)

    async def in_turn(w: int, i: int) -> None:
        for body in singles:
            await call(single, body)

    async def at_once(w: int, i: int) -> None:
        async with anyio.create_task_group() as tg:
            for body in singles:
                tg.start_soon(call, single, body)

    return {fn: one_call, IN_TURN: in_turn, AT_ONCE: at_once}


async def paired(ours: Op, other: Op, seconds: float, rounds: int) -> tuple[float, float]:
    ours_rates, other_rates = [], []
    for _ in range(rounds):
        ours_rates.append((await timed(ours, 1, seconds))[0])
        other_rates.append((await timed(other, 1, seconds))[0])
    return statistics.median(ours_rates), statistics.median(other_rates)


async def _face(ops: dict[str, Op], fn: str, seconds: float, rounds: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for other in (IN_TURN, AT_ONCE):
        batch_rate, other_rate = await paired(ops[fn], ops[other], seconds, rounds)
        row[other] = {"batch_per_s": round(batch_rate, 1), "singles_per_s": round(other_rate, 1),
                      "ratio": round(batch_rate / other_rate, 2)}
    return row


async def batch_vs_singles(url: str, prefix: str, fn: str, ops_of: Callable[[Call], dict[str, Op]],
                           prepare: Callable[[StateStore], Awaitable[None]], seconds: float,
                           rounds: int) -> dict[str, Any]:
    """Both faces' rows: {face: {in turn | at once: {batch_per_s, singles_per_s, ratio}}}."""
    service = start_service(url, prefix)
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=prefix)) as client, \
                StateStore.open(url, prefix=prefix, reaper=False) as store:
            await prepare(store)
            return {"bus (StateClient)": await _face(ops_of(client.call_json), fn, seconds,
                                                     rounds),
                    "in process (StateStore)": await _face(ops_of(store.call_json), fn,
                                                           seconds, rounds)}
    finally:
        service.terminate()
        service.wait(timeout=30)


def report(out: Any, title: str, faces: dict[str, Any], units: tuple[str, str], target: float,
           note: str) -> None:
    print(f"\n{title:<44}{units[0]:>9}{units[1]:>9}{'ratio':>8}{'target':>8}", file=out)
    for face, row in faces.items():
        for other, figures in row.items():
            goal = f"{target:.0f}" if other == IN_TURN else ""
            print(f"{face + ', ' + other:<44}{figures['batch_per_s']:>9.1f}"
                  f"{figures['singles_per_s']:>9.1f}{figures['ratio']:>8.2f}{goal:>8}", file=out)
    print(note, file=out)
