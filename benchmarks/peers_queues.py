"""The peers section's Redis job queue (benchmarks/bench_peers.py): saq, a queue a user would
otherwise put in front of Redis to have a worker store something. It runs on a redis-server of
its own (`appendfsync everysec`, as `fast`), with a worker process of its own (`python -m
benchmarks.peers_queues <url>`, 64 jobs at a time) whose job does what one `state::set`
stores: one Redis SET. The bench's caller enqueues a job and awaits its result: the queue's
round trip (enqueue, the worker's pick-up, the job, the result back). The caller asks for the
result every POLL_S (`apply`'s `poll_interval`; its default, 0.5 s, would measure the poll, not
the queue): saq's pubsub notice of a finished job did not reach its caller here (saq 0.26,
redis-py 8), so `apply` polls. saq offers no reads, compare-and-set nor events: only the `set`
rows have its figures. arq is not measured: arq 0.28 requires redis-py < 6, which the project's
own redis-py dependency is not.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aredis

from benchmarks.floor_process import VALUE, stop_process
from benchmarks.peers_ops import WORKERS
from benchmarks.pgserver import free_port

CONCURRENCY = 64  # jobs the worker runs at once (saq's `concurrency`)
POLL_S = 0.01  # how often a caller asks for its job's result
LOST_S = 5.0  # a job not done by then is one saq lost (a round waits for its every job)
TEXT = VALUE.decode()  # the value stored (saq sends its arguments as JSON)
SWEEP_S = 86_400  # the worker's sweeps after its first, at the start


async def set_one(ctx: Any, *, name: str, value: str) -> bool:
    """The job: one SET (saq passes keyword arguments; `key` would be the job's own)."""
    return bool(await ctx["store"].set(name, value))


def _serve(url: str) -> None:
    """The worker process: serves the queue on `url` until terminated."""
    from saq import Queue, Worker  # type: ignore[import-not-found,unused-ignore]

    async def startup(ctx: Any) -> None:
        ctx["store"] = aredis.Redis.from_url(url)

    # Its sweep aborts an active job whose status it reads before the worker has marked it
    # active (a race of saq's: ABORTED "swept", which ends the run): once at the start, when
    # no job is in flight (`saq_peer` waits for it), then not again for the bench's length.
    timers: Any = {"sweep": SWEEP_S}  # (saq's PartialTimersDict)
    worker = Worker(Queue.from_url(url), functions=[("set_one", set_one)],
                    concurrency=CONCURRENCY, startup=startup, timers=timers)
    anyio.run(worker.start)


@contextlib.asynccontextmanager
async def saq_peer(directory: Path) -> AsyncIterator[tuple[Any, dict[str, int]] | str]:
    """(the `set` op: enqueue one job and await its result, the pids of redis-server and the
    worker), or a text saying why there is none (saq is not installed)."""
    try:
        from saq import Queue
    except ImportError as exc:
        yield f"saq is not installed (the bench extra of pyproject.toml): {exc}"
        return
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"  # (saq takes no unix socket URL)
    directory.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--dir", str(directory), "--appendonly", "yes",
                               "--appendfsync", "everysec", "--save", ""],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker: subprocess.Popen[bytes] | None = None
    try:
        await _answers(url)
        worker = subprocess.Popen([sys.executable, "-m", "benchmarks.peers_queues", url],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        queue = Queue.from_url(url)
        await queue.connect()
        # Its worker started and its first sweep done (the sweep's lock is taken) before the
        # first job: one in flight at the sweep could be aborted (`_serve`).
        probe = aredis.Redis.from_url(url)
        with anyio.fail_after(60):
            while not (await queue.info()).get("workers") or \
                    not await probe.exists(f"saq:{queue.name}:sweep"):
                await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # (the sweep's lock is taken at its start: its end)
        await probe.aclose()

        async def saq_set(w: int, i: int) -> Any:
            # A job saq loses (seen here: its status "queued", in no queue's list) would hold
            # the round for ever; one not done in LOST_S counts as that long and is named.
            with anyio.move_on_after(LOST_S) as waited:
                return await queue.apply("set_one", poll_interval=POLL_S, name=f"q{w}",
                                         value=TEXT)
            if waited.cancelled_caught:
                print(f"(saq: a job not done after {LOST_S:g} s, taken as lost)",
                      file=sys.stderr)
            return None

        with anyio.fail_after(60):  # a job of each caller done before the rounds
            for w in range(WORKERS):
                await saq_set(w, 0)
        yield saq_set, {"redis": server.pid, "worker": worker.pid}
        await queue.disconnect()
    finally:
        if worker is not None:
            stop_process(worker)
        stop_process(server)


async def _answers(url: str) -> None:
    """Once the redis-server at `url` answers a PING (at most 15 s)."""
    client = aredis.Redis.from_url(url)
    with anyio.fail_after(15):
        while True:
            try:
                await client.ping()
                break
            except (OSError, aredis.ConnectionError):
                await anyio.sleep(0.02)
    await client.aclose()


if __name__ == "__main__":
    _serve(sys.argv[1])
