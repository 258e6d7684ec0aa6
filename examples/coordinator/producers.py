"""The producers: N concurrent workers, each writing its result into the current round.

    .venv/bin/python examples/coordinator/producers.py
"""

from __future__ import annotations

import random

import anyio

from stateworker import StateClient


async def produce(client: StateClient, round_id: str, n: int) -> None:
    await anyio.sleep(random.random() / 10)  # producers finish in any order
    await client.set(round_id, f"producer-{n}", {"producer": n, "result": n * n})


async def main() -> None:
    async with StateClient() as client:
        current = await client.get("coordinator", "round")
        if current is None:
            raise SystemExit("no round: start coordinator.py first")
        async with anyio.create_task_group() as tg:
            for n in range(current["producers"]):
                tg.start_soon(produce, client, current["id"], n)
        print(f"{current['producers']} producers reported in {current['id']}")


if __name__ == "__main__":
    anyio.run(main)
