"""The coordinator: woken exactly once, with every producer's result, when all have reported.

One round, in this order:
1. a fresh round id, and the trigger `coordinator-<round>` on the round's scope, whose
   condition `state::barrier` expects one result per producer. The trigger has a lease
   (`ttl_ms`), renewed with `state::keep-trigger` every third of it while the coordinator
   runs: a coordinator that dies (even by kill -9) leaves no trigger behind after its ttl;
2. only then the round is published, open, at `coordinator/round`, where producers.py takes
   it (by compare-and-set: one producers run per round, never an old round);
3. `coordinator::all_done` takes the wake of its own round only (another round's is a dead
   coordinator's, which it ignores); then the trigger is unregistered.

    .venv/bin/python examples/coordinator/coordinator.py --producers 5
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

import anyio

from stateworker import StateClient, StateError, Worker

ROUND = ("coordinator", "round")  # where the open round is published (scope, key)


def trigger_of(round_id: str, producers: int, ttl_ms: int) -> dict[str, Any]:
    return {"id": f"coordinator-{round_id}", "function_id": "coordinator::all_done",
            "service": "coordinator", "ttl_ms": ttl_ms,
            "config": {"scope": round_id, "event_types": ["created", "updated"],
                       "condition_function_id": "state::barrier",
                       "condition_config": {"id": round_id, "expect": producers,
                                            "key_from": "/key", "carry": "/new_value"}}}


async def keep_alive(client: StateClient, trigger_id: str, ttl_ms: int,
                     ended: anyio.Event) -> None:
    """Renew the trigger's lease every third of its ttl; once it is gone, the round ended."""
    while True:
        await anyio.sleep(ttl_ms / 3000)
        try:
            await client.keep_trigger(trigger_id)
        except StateError as exc:
            if exc.code != "NOT_FOUND":
                raise
            ended.set()
            return


async def main(producers: int, linger_s: float, ttl_ms: int) -> int:
    round_id = f"round-{uuid.uuid4().hex[:8]}"
    trigger = trigger_of(round_id, producers, ttl_ms)
    worker = Worker(service="coordinator")
    woken: list[dict[str, Any]] = []
    ended = anyio.Event()  # the first wake, or the lease lost

    @worker.function("coordinator::all_done")
    async def all_done(body: dict[str, Any], call: Any) -> None:
        if body["scope"] != round_id:  # a dead coordinator's round, delivered to this one
            print(f"ignored the wake of {body['scope']} (not this round)", file=sys.stderr)
            return
        woken.append(body["condition_payload"]["results"])
        ended.set()

    async with StateClient() as client, anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await client.call("state::register-trigger", trigger)
        async with anyio.create_task_group() as leased:
            leased.start_soon(keep_alive, client, trigger["id"], ttl_ms, ended)
            await client.set(*ROUND, {"id": round_id, "producers": producers,
                                      "ttl_ms": ttl_ms, "state": "open"})
            print(f"waiting for {producers} producers in {round_id}", flush=True)
            await ended.wait()
            if woken:
                with anyio.move_on_after(linger_s):  # a second wake would show here
                    await anyio.sleep_forever()
            leased.cancel_scope.cancel()
        await client.call("state::unregister-trigger", {"id": trigger["id"]})
        worker.stop()
    if not woken:
        print(f"{round_id}: the trigger's lease was lost before the wake", flush=True)
        return 1
    print(f"woken {len(woken)} time(s) with {len(woken[0])} results: "
          f"{json.dumps(woken[0], sort_keys=True)}", flush=True)
    return 0 if len(woken) == 1 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=5)
    parser.add_argument("--linger-s", type=float, default=1.0,
                        help="how long to stay after the wake (to see that it comes once)")
    parser.add_argument("--ttl-ms", type=int, default=10_000,
                        help="the trigger's lease: gone this long after the coordinator dies")
    args = parser.parse_args()
    raise SystemExit(anyio.run(main, args.producers, args.linger_s, args.ttl_ms))
