"""examples/coordinator runs as the README says: the coordinator is woken exactly once, with
every producer's result."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import uuid
from pathlib import Path

from tests.servers import RedisServer, ServiceProcess

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "coordinator"


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"nothing printed within {timeout} s"
    return process.stdout.readline()


def test_the_coordinator_wakes_exactly_once_with_every_result(redis_server: RedisServer) -> None:
    prefix = f"ex{uuid.uuid4().hex[:8]}"
    service = ServiceProcess(redis_server.url, prefix, consumer="example")
    service.start()
    env = {**service.env, "STATEWORKER_REDIS_URL": redis_server.url}
    coordinator = subprocess.Popen(
        [sys.executable, str(EXAMPLE / "coordinator.py"), "--producers", "7"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert read_line(coordinator, 30).startswith("waiting for 7 producers in round-")
        produced = subprocess.run([sys.executable, str(EXAMPLE / "producers.py")], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60)
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout.startswith("7 producers reported in round-")
        woken = read_line(coordinator, 30)
        assert coordinator.wait(timeout=30) == 0
        head, _, results = woken.partition(": ")
        assert head == "woken 1 time(s) with 7 results"
        assert json.loads(results) == {f"producer-{n}": {"producer": n, "result": n * n}
                                       for n in range(7)}
        with redis_server.client() as client:  # one handler call, ever
            info = client.xinfo_stream(f"{prefix}:bus:coordinator")
            assert info["entries-added"] == 1
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        coordinator.wait()
        if coordinator.stdout is not None:
            coordinator.stdout.close()
        service.kill()

