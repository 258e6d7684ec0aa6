"""The coordinator: woken exactly once, with every producer's result, when all have reported.

It starts a new round (a fresh barrier id, kept at `coordinator/round` so the producers find
it), registers a trigger on the round's scope whose condition is `state::barrier`, and
serves `coordinator::all_done`. Each producer's write is one arrival; the arrival that
completes the set wakes `all_done` with `condition_payload.results`.

    .venv/bin/python examples/coordinator/coordinator.py --producers 5
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import anyio

from stateworker import StateClient, Worker


async def main(producers: int, linger_s: float) -> int:
    round_id = f"round-{uuid.uuid4().hex[:8]}"
    worker = Worker(service="coordinator")
    woken: list[dict[str, Any]] = []
    first_wake = anyio.Event()

    @worker.function("coordinator::all_done")
    async def all_done(body: dict[str, Any], call: Any) -> None:
        woken.append(body["condition_payload"]["results"])
        first_wake.set()

    async with StateClient() as client, anyio.create_task_group() as tg:
        await tg.start(worker.run)
        await client.call("state::register-trigger", {
            "id": f"coordinator-{round_id}", "function_id": "coordinator::all_done",
            "service": "coordinator",
            "config": {"scope": round_id, "event_types": ["created", "updated"],
                       "condition_function_id": "state::barrier",
                       "condition_config": {"id": round_id, "expect": producers,
                                            "key_from": "/key", "carry": "/new_value"}}})
        await client.set("coordinator", "round", {"id": round_id, "producers": producers})
        print(f"waiting for {producers} producers in {round_id}", flush=True)
        await first_wake.wait()
        with anyio.move_on_after(linger_s):  # a second wake would show here
            await anyio.sleep_forever()
        await client.call("state::unregister-trigger", {"id": f"coordinator-{round_id}"})
        worker.stop()
    print(f"woken {len(woken)} time(s) with {len(woken[0])} results: "
          f"{json.dumps(woken[0], sort_keys=True)}", flush=True)
    return 0 if len(woken) == 1 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=5)
    parser.add_argument("--linger-s", type=float, default=1.0,
                        help="how long to stay after the wake (to see that it comes once)")
    args = parser.parse_args()
    raise SystemExit(anyio.run(main, args.producers, args.linger_s))
