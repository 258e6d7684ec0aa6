"""The get-many part of `stateworker bench`: one `state::get-many` of KEYS keys against KEYS
`state::get` calls for the same keys, over the bus (StateClient to a `stateworker serve`) and in
process (StateStore), as ratios measured in the same run.

The gets run two ways: one after another (a round trip each: what a loop over keys costs) and
all at once (gathered: the bus and the store pipeline them, the best a caller can do without
get-many). Each pair is measured in alternation and the median of the rounds kept, so drift on
this shared machine hits both sides alike. A rate is batches of KEYS keys read per second, one
caller.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio

from benchmarks.bench_bus import start_service
from benchmarks.benchtime import timed
from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from stateworker.state.api import StateStore

PREFIX = "benchgm"
KEYS = 100
SCOPE = "bench-getmany"
TARGET = 10.0  # get-many / sequential gets (issue 23)
Call = Callable[[str, bytes], Coroutine[Any, Any, bytes]]  # call_json(fn, body)


def _bodies() -> tuple[bytes, list[bytes]]:
    keys = [f"k{i:03d}" for i in range(KEYS)]
    many = b'{"scope":"%s","keys":[%s]}' % (SCOPE.encode(),
                                             b",".join(b'"%s"' % k.encode() for k in keys))
    return many, [b'{"scope":"%s","key":"%s"}' % (SCOPE.encode(), k.encode()) for k in keys]


def _ops(call: Call) -> dict[str, Callable[[int, int], Awaitable[Any]]]:
    many, singles = _bodies()

    async def get_many(w: int, i: int) -> None:
        await call("state::get-many", many)

    async def gets_in_turn(w: int, i: int) -> None:
        for body in singles:
            await call("state::get", body)

    async def gets_at_once(w: int, i: int) -> None:
        async with anyio.create_task_group() as tg:
            for body in singles:
                tg.start_soon(call, "state::get", body)

    return {"get-many": get_many, "gets in turn": gets_in_turn, "gets at once": gets_at_once}


async def paired(ours: Callable[[int, int], Awaitable[Any]],
                other: Callable[[int, int], Awaitable[Any]], seconds: float,
                rounds: int) -> tuple[float, float]:
    ours_rates, other_rates = [], []
    for _ in range(rounds):
        ours_rates.append((await timed(ours, 1, seconds))[0])
        other_rates.append((await timed(other, 1, seconds))[0])
    return statistics.median(ours_rates), statistics.median(other_rates)


async def _face(call: Call, seconds: float, rounds: int) -> dict[str, Any]:
    ops = _ops(call)
    row: dict[str, Any] = {}
    for other in ("gets in turn", "gets at once"):
        many_rate, other_rate = await paired(ops["get-many"], ops[other], seconds, rounds)
        row[other] = {"get_many_per_s": round(many_rate, 1),
                      "gets_per_s": round(other_rate, 1),
                      "ratio": round(many_rate / other_rate, 2)}
    return row


async def getmany_section(url: str, seconds: float, rounds: int, out: Any) -> dict[str, Any]:
    service = start_service(url, PREFIX)
    try:
        async with StateClient(settings=Settings(redis_url=url, prefix=PREFIX)) as client, \
                StateStore.open(url, prefix=PREFIX, reaper=False) as store:
            for i in range(KEYS):
                await store.set(SCOPE, f"k{i:03d}", {"n": i, "name": "bench", "ok": True})
            faces = {"bus (StateClient)": await _face(client.call_json, seconds, rounds),
                     "in process (StateStore)": await _face(store.call_json, seconds, rounds)}
    finally:
        service.terminate()
        service.wait(timeout=30)
    print(f"\n{f'get-many of {KEYS} keys vs {KEYS} gets':<44}{'many/s':>9}{'gets/s':>9}"
          f"{'ratio':>8}{'target':>8}", file=out)
    for face, row in faces.items():
        for other, figures in row.items():
            target = f"{TARGET:.0f}" if other == "gets in turn" else ""
            print(f"{face + ', ' + other:<44}{figures['get_many_per_s']:>9.1f}"
                  f"{figures['gets_per_s']:>9.1f}{figures['ratio']:>8.2f}{target:>8}", file=out)
    print(f"a rate is batches of {KEYS} keys read per second by one caller; gets at once: "
          f"{KEYS} gets in flight together (pipelined)", file=out)
    return {"keys": KEYS, "target": TARGET, "faces": faces}
