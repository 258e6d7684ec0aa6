"""The producers: N concurrent workers, each writing its result into the round a waiting
coordinator started (coordinator.py).

They wait for an open round at `coordinator/round` and take it with compare-and-set (so one
producers run takes each round, and a round already taken, such as the previous one, is never
taken again). A round's coordinator may have died since it published it (its trigger, leased,
then vanishes within its ttl): after taking a round the producers wait until its trigger's
lease is renewed, the coordinator's proof of life, and look for a fresh round if it vanishes.

    .venv/bin/python examples/coordinator/producers.py
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import anyio

from stateworker import StateClient

ROUND = ("coordinator", "round")  # where coordinator.py publishes its open round
POLL_S = 0.05  # how often the round and its trigger are read while waiting


async def expires_at(client: StateClient, trigger_id: str) -> str | None:
    """The trigger's `expires_at` (RFC 3339, ms), or None when it is not registered."""
    for trigger in (await client.list_triggers())["triggers"]:
        if trigger["id"] == trigger_id:
            return str(trigger.get("expires_at", ""))
    return None


async def alive(client: StateClient, round_id: str) -> bool:
    """Whether the round's coordinator renews its trigger after now (else it is gone)."""
    trigger_id = f"coordinator-{round_id}"
    seen = await expires_at(client, trigger_id)
    while seen is not None:
        await anyio.sleep(POLL_S)
        now = await expires_at(client, trigger_id)
        if now is not None and now > seen:  # (the same RFC 3339 form: text order is time order)
            return True
        seen = now
    return False


async def take_round(client: StateClient) -> dict[str, Any]:
    """The open round of a coordinator that is waiting, taken by this run."""
    while True:
        current = await client.get(*ROUND)
        if current is not None and current.get("state") == "open":
            swap = await client.compare_and_set(*ROUND, {**current, "state": "taken"}, current)
            if swap["swapped"] and await alive(client, current["id"]):
                return current  # (a dead coordinator's round: wait for a fresh one)
        await anyio.sleep(POLL_S)


async def produce(client: StateClient, round_id: str, n: int) -> None:
    await anyio.sleep(random.random() / 10)  # producers finish in any order
    await client.set(round_id, f"producer-{n}", {"producer": n, "result": n * n})


async def main(wait_s: float) -> int:
    async with StateClient() as client:
        with anyio.move_on_after(wait_s):
            current = await take_round(client)
            async with anyio.create_task_group() as tg:
                for n in range(current["producers"]):
                    tg.start_soon(produce, client, current["id"], n)
            print(f"{current['producers']} producers reported in {current['id']}", flush=True)
            return 0
    print(f"no waiting coordinator's round within {wait_s} s: start coordinator.py", flush=True)
    return 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wait-s", type=float, default=30.0,
                        help="how long to wait for a coordinator's open round")
    args = parser.parse_args()
    raise SystemExit(anyio.run(main, args.wait_s))
