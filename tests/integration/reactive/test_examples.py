"""examples/coordinator runs as the README says, 20 times in a row against one service: each
round's coordinator is woken exactly once, with every producer's result of its own round,
even with the producers started at the same moment as their coordinator, and after another
coordinator was killed (kill -9) mid-round whose round late producers then completed (its
wake waits on the coordinators' stream for the next coordinator, which ignores it); no
coordinator's trigger stays registered."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "coordinator"
RUNS = 20
KILLED_BEFORE = 10  # the run before which a coordinator is killed mid-round
PRODUCERS = 3
TTL_MS = 1000  # the coordinators' trigger lease (kept every third of it)
KILLED_TTL_MS = 3000  # the killed one's: time for the late producers to complete its round


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"nothing printed within {timeout} s"
    return process.stdout.readline()


def start(script: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(EXAMPLE / script), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def coordinator(env: dict[str, str], ttl_ms: int = TTL_MS) -> subprocess.Popen[str]:
    return start("coordinator.py", env, "--producers", str(PRODUCERS), "--linger-s", "0.2",
                 "--ttl-ms", str(ttl_ms))


def waiting_round(process: subprocess.Popen[str]) -> str:
    line = read_line(process, 30)
    head = f"waiting for {PRODUCERS} producers in "
    assert line.startswith(head), line
    return line[len(head):].strip()


def one_run(env: dict[str, str]) -> str:
    """A coordinator and its producers started together; the round, woken once."""
    waiting, producing = coordinator(env), start("producers.py", env)
    try:
        round_id = waiting_round(waiting)
        out, err = producing.communicate(timeout=60)
        assert producing.returncode == 0, err
        assert out == f"{PRODUCERS} producers reported in {round_id}\n"
        woken, err = waiting.communicate(timeout=30)
        assert waiting.returncode == 0, err
        head, _, results = woken.partition(": ")
        assert head == f"woken 1 time(s) with {PRODUCERS} results"
        assert json.loads(results) == {f"producer-{n}": {"producer": n, "result": n * n}
                                       for n in range(PRODUCERS)}
        return round_id
    finally:
        for process in (waiting, producing):
            if process.poll() is None:
                process.kill()
                process.communicate()


def kill_mid_round(env: dict[str, str]) -> str:
    """A coordinator killed (SIGKILL) while it waits for its producers; its round."""
    doomed = coordinator(env, KILLED_TTL_MS)
    round_id = waiting_round(doomed)
    doomed.kill()
    doomed.communicate()
    return round_id


async def test_the_coordinator_wakes_exactly_once_per_round_20_times(
        redis_server: RedisServer) -> None:
    prefix = f"ex{uuid.uuid4().hex[:8]}"
    service = ServiceProcess(redis_server.url, prefix, consumer="example")
    service.start()
    env = {**service.env, "STATEWORKER_REDIS_URL": redis_server.url}
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    redis = redis_server.client()
    try:
        async with StateClient(settings=settings, timeout=30) as client:
            async def coordinator_triggers() -> list[str]:
                return [t["id"] for t in (await client.list_triggers())["triggers"]
                        if t["id"].startswith("coordinator-")]

            def calls() -> int:  # handler calls to the coordinators, ever
                return int(redis.xinfo_stream(f"{prefix}:bus:coordinator")["entries-added"])

            rounds, killed, late = [], "", 0
            for run in range(RUNS):
                if run == KILLED_BEFORE:
                    killed = kill_mid_round(env)
                    assert await coordinator_triggers() == [f"coordinator-{killed}"]
                    for n in range(PRODUCERS):  # late producers complete the dead round
                        await client.set(killed, f"producer-{n}", {"late": n})
                    late = 1
                    await until(lambda: calls() == KILLED_BEFORE + 1, 30,
                                "the dead round's wake")
                rounds.append(one_run(env))
                assert calls() == run + 1 + late  # one handler call per round
            assert len(set(rounds)) == RUNS and killed not in rounds
            assert await coordinator_triggers() == []  # the killed one's lease lapsed too
            await until(lambda: not redis.hlen(f"{prefix}:{{{prefix}:reg}}:triggers"), 10,
                        "the killed coordinator's trigger reaped")
    finally:
        service.kill()


@pytest.mark.parametrize("script", ["coordinator.py", "producers.py"])
def test_help_describes_the_example_and_touches_no_redis(script: str) -> None:
    # (an unreachable Redis: a script that ran instead of helping would fail)
    env = {**os.environ, "STATEWORKER_REDIS_URL": "redis://127.0.0.1:9/0"}
    done = subprocess.run([sys.executable, str(EXAMPLE / script), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} ")
    assert "--wait-s" in done.stdout if script == "producers.py" else "--ttl-ms" in done.stdout
