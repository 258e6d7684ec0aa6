"""Riding out a Redis that cannot serve for a while (transport/retry.py), as callers meet
it: StateClient and Worker ride out a kill -9 and a restart that loads a dataset, and a Redis
BUSY with a slow script; a call that never reaches Redis is UNAVAILABLE; a Worker started
before its Redis waits for it and says so once, or exits with one line."""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.bus.worker import Worker
from stateworker.errors import CallTimeout, StateError, Unavailable
from stateworker.reactive.leases import Leases
from stateworker.state.api import StateStore
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost, ReplyError
from tests.integration.services import settings_for
from tests.servers import BUSY_SCRIPT, RedisServer, free_port, wait_until

pytestmark = pytest.mark.anyio


LOAD_KEYS = 10_000  # keys of the dataset Redis loads after the restart


KEY_LOAD_DELAY_US = 120  # per key: about 1.5 s of LOADING


class LoadingRedis(RedisServer):
    """A redis-server (AOF fsynced on every write, so an acknowledged write survives kill -9)
    that takes its time to load its data: `key-load-delay` per key of the AOF's RDB base, and
    clients served every 1 KiB loaded, so that after a restart they meet LOADING replies for
    a while rather than a server that does not answer at all."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, appendfsync="always")

    def launch(self) -> None:
        """Start the process on the same port and directory; do not wait for it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.directory), "--appendonly", "yes", "--appendfsync", "always",
             "--save", "", "--logfile", str(self.directory / "redis.log"),
             "--key-load-delay", str(KEY_LOAD_DELAY_US),
             "--loading-process-events-interval-bytes", "1024"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        self.launch()
        wait_until(self.answers, 15, f"redis-server on port {self.port}")

    def fill(self, keys: int) -> None:
        """`keys` keys in the AOF's RDB base (a rewrite), which a restart loads key by key."""
        with redis.Redis(port=self.port) as client:
            pipe = client.pipeline(transaction=False)
            for i in range(keys):
                pipe.set(f"fill:{i}", "x" * 64)
            pipe.execute()
            client.bgrewriteaof()

            def rewritten() -> bool:
                info = client.info("persistence")
                return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

            wait_until(rewritten, 30, "the AOF rewrite")
            assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"


async def ping_error(port: int, read_timeout_s: float) -> str:
    """The error Redis on `port` answers PING with ("" for none); a lost connection raises."""
    conn = RedisConnection(f"redis://127.0.0.1:{port}/0", connect_timeout_s=1,
                           read_timeout_s=read_timeout_s)
    try:
        await conn.execute("PING")
    except ReplyError as exc:
        return str(exc)
    finally:
        await conn.close()
    return ""


async def loading(port: int) -> bool:
    """Whether Redis on `port` answers LOADING (it is loading its dataset)."""
    try:
        return (await ping_error(port, read_timeout_s=1)).startswith("LOADING")
    except ConnectionLost:
        return False


# ---- Redis killed and restarted with a dataset to load, under load ---------------------------
async def test_clients_and_worker_ride_out_a_restart_that_loads(tmp_path: Path,
                                                                prefix: str) -> None:
    server = LoadingRedis(tmp_path / "redis")
    server.start()
    try:
        await anyio.to_thread.run_sync(server.fill, LOAD_KEYS)
        await restart_under_load(server, prefix)
    finally:
        server.kill()


async def test_the_dispatchers_heartbeat_meets_loading_as_redis_away(tmp_path: Path,
                                                                      prefix: str) -> None:
    """After a restart, the dispatcher's heartbeat (one pipeline) meets LOADING replies: it
    raises the ReplyError, which the dispatcher pauses on, not a TypeError it logs as a
    crash of its own."""
    server = LoadingRedis(tmp_path / "redis")
    server.start()
    try:
        await anyio.to_thread.run_sync(server.fill, LOAD_KEYS)
        async with StateStore.open(server.url, prefix=prefix, partitions=4,
                                   reaper=False) as store:
            leases = Leases(store.state, "token")
            await leases.beat()
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
            server.launch()
            with anyio.fail_after(10):
                while not await loading(server.port):
                    await anyio.sleep(0.005)  # polling until it answers, LOADING
                while True:  # (the first beat may meet the connection the kill broke)
                    try:
                        await leases.beat()
                    except ConnectionLost:
                        continue
                    except ReplyError as exc:
                        assert str(exc).startswith("LOADING"), exc
                        break
                    raise AssertionError("a heartbeat succeeded while Redis was loading")
    finally:
        server.kill()


async def restart_under_load(server: LoadingRedis, prefix: str) -> None:
    settings = settings_for(server, prefix)
    scope = f"restart-{uuid.uuid4().hex[:6]}"
    worker = Worker("orders", settings=settings, options=BusOptions(block_ms=50))
    runs: Counter[str] = Counter()

    @worker.function("orders::add")
    async def add(body: Any, call: Call) -> Any:
        runs[call.id or ""] += 1
        return {"sum": body["a"] + body["b"]}

    tasks = 8
    outcomes: Counter[tuple[str, str]] = Counter()  # (service, OK or the error's code)
    ok_state = Counter[int]()  # task -> state::update calls answered OK
    timed_out_state = Counter[int]()  # task -> state::update calls that ended in TIMEOUT
    after_restart: Counter[tuple[int, str]] = Counter()  # OK answers once Redis was back
    back = anyio.Event()
    stopping = anyio.Event()

    async def caller(task: int, state: StateClient, orders: StateClient) -> None:
        n = 0
        while not stopping.is_set():
            n += 1
            for service in ("state", "orders"):
                try:
                    if service == "state":
                        await state.update(scope, f"k{task}",
                                           [{"type": "increment", "path": "n", "by": 1}])
                        ok_state[task] += 1
                    else:
                        assert await orders.call("orders::add", {"a": task, "b": n}) == {
                            "sum": task + n}
                    outcome = "OK"
                    if back.is_set():
                        after_restart[task, service] += 1
                except StateError as exc:  # any other exception ends the test
                    outcome = exc.code
                    if service == "state" and isinstance(exc, CallTimeout):
                        timed_out_state[task] += 1
                outcomes[service, outcome] += 1

    async with StateService.running(settings, BusOptions(block_ms=50)) as service, \
            anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with StateClient(settings=settings, timeout=1.5) as state, \
                StateClient(settings=settings, service="orders", timeout=1.5) as orders, \
                StateClient(settings=settings, timeout=10) as probe, \
                anyio.create_task_group() as callers:
            for task in range(tasks):
                callers.start_soon(caller, task, state, orders)
            with anyio.fail_after(10):  # all callers are under way before the kill
                while min(ok_state[t] for t in range(tasks)) < 3:
                    await anyio.sleep(0.01)  # polling the callers' counts
            before = sum(outcomes.values())

            assert server.process is not None
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
            server.launch()  # the same port and data: it loads the dataset first
            with anyio.fail_after(10):
                while not await loading(server.port):
                    await anyio.sleep(0.005)  # polling until it answers, LOADING
            # Sent now, a call meets LOADING, retries and succeeds once Redis has loaded; a
            # client opened now waits for Redis rather than failing.
            async def probe_call() -> None:
                assert (await probe.call("state::get", {"scope": scope, "key": "k0"}))["n"] >= 3

            async def open_late() -> None:
                async with StateClient(settings=settings, timeout=10) as late:
                    assert late.transient["LOADING"] >= 1  # it opened while Redis loaded
                    assert (await late.get(scope, "k0"))["n"] >= 3

            async with anyio.create_task_group() as both:
                both.start_soon(probe_call)
                both.start_soon(open_late)
            assert probe.transient["LOADING"] >= 1, probe.transient
            back.set()
            with anyio.fail_after(15):  # calls succeed again, with the same clients
                while min(after_restart[t, s] for t in range(tasks)
                          for s in ("state", "orders")) < 2:
                    await anyio.sleep(0.01)  # polling the callers' counts
            stopping.set()

        # Every call ended with a result or UNAVAILABLE / TIMEOUT (DEADLINE_EXCEEDED: the
        # service read a re-sent entry only after its deadline, so it never ran); any other
        # exception would have ended the task group, and the test, with it.
        print("outcomes:", dict(outcomes), "clients met:", dict(state.transient),
              dict(orders.transient), "service met:", dict(service.runtime.transient),
              "worker met:", dict(worker.runtime.transient if worker.runtime else {}))
        assert {code for _, code in outcomes} <= {"OK", "UNAVAILABLE", "TIMEOUT",
                                                   "DEADLINE_EXCEEDED"}
        assert sum(outcomes.values()) > before
        # The clients really met the restart: refused or broken connections, and LOADING.
        met = state.transient + orders.transient
        assert met["CONNECTION"] >= 1 and met["LOADING"] >= 1, met
        assert service.runtime.transient["LOADING"] + service.runtime.transient[
            "CONNECTION"] >= 1
        assert worker.runtime is not None and sum(worker.runtime.transient.values()) >= 1

        # Exactly what the outcomes say was applied: every OK increment, plus at most the
        # calls that timed out (sent, maybe applied before their deadline); UNAVAILABLE ones
        # never reached the stream. Wait for their deadlines and for the stream to drain.
        raw = aredis.Redis(port=server.port)
        try:
            with anyio.fail_after(15):
                while await raw.xlen(f"{prefix}:bus:state"):
                    await anyio.sleep(0.01)  # polling: entries go once acknowledged
            async with StateClient(settings=settings) as check:
                for task in range(tasks):
                    n = (await check.get(scope, f"k{task}"))["n"]
                    assert ok_state[task] <= n <= ok_state[task] + timed_out_state[task], (
                        task, n, ok_state[task], timed_out_state[task])
        finally:
            await raw.aclose()
        worker.stop()


# ---- a call that never reaches Redis ---------------------------------------------------------
async def test_a_call_that_never_reaches_redis_is_unavailable(tmp_path: Path,
                                                              prefix: str) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    settings = settings_for(server, prefix)
    try:
        async with StateClient(settings=settings, timeout=0.5) as client:
            server.kill()  # and not back: every send is refused
            with anyio.fail_after(5):  # the client has seen it (a call written on a socket
                while not client.transient["CONNECTION"]:  # that breaks under it may have
                    await anyio.sleep(0.01)  # reached Redis: TIMEOUT, not UNAVAILABLE)
            started = time.monotonic()
            with pytest.raises(Unavailable) as caught:
                await client.set("s", "k", 1)
            assert 0.4 <= time.monotonic() - started < 3  # its timeout, retrying meanwhile
            assert caught.value.details["sent"] is False
            assert "will not be applied" in caught.value.message
            assert client.transient["CONNECTION"] >= 2
    finally:
        server.kill()
    with pytest.raises(Unavailable) as opening:  # opening waits its timeout, then says why
        async with StateClient(settings=settings, timeout=0.3):
            pass
    assert server.url in opening.value.message and "./scripts/run" in opening.value.message


# ---- a worker started before its Redis -------------------------------------------------------
async def test_worker_waits_for_redis_and_says_so(tmp_path: Path, prefix: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(tmp_path / "redis")  # its port chosen, not started yet
    settings = settings_for(server, prefix)
    worker = Worker("late", settings=settings, options=BusOptions(block_ms=50))

    @worker.function("late::ping")
    async def ping(body: Any, call: Call) -> Any:
        return "pong"

    serving = anyio.Event()

    async def run() -> None:
        async with anyio.create_task_group() as inner:
            await inner.start(worker.run)
            serving.set()

    caplog.set_level(logging.INFO, logger="stateworker")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            with anyio.fail_after(10):
                while not any("waiting for it" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.01)  # polling the log for the worker's message
            waiting = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
            assert len(waiting) == 1  # one line, not one per retry
            assert server.url in waiting[0] and "./scripts/run" in waiting[0]
            assert "STATEWORKER_REDIS_URL" in waiting[0]
            await anyio.to_thread.run_sync(server.start)
            with anyio.fail_after(10):
                await serving.wait()
            started = [r for r in caplog.records if r.getMessage() == "serving"]
            assert len(started) == 1, started
            assert {name: getattr(started[0], name, None) for name in
                    ("service", "stream", "functions")} == {
                "service": "late", "stream": f"{prefix}:bus:late", "functions": "late::ping"}
            assert getattr(started[0], "consumer", "")
            async with StateClient(settings=settings, service="late") as client:
                assert await client.call("late::ping", {}) == "pong"
            worker.stop()
    finally:
        server.kill()


WORKER_SCRIPT = """
import sys
from stateworker import Worker
worker = Worker("orders", sys.argv[1], start_wait_s=0.3)

@worker.function("orders::create")
async def create(body, call):
    return body

worker.serve()
"""


async def test_worker_serve_without_redis_exits_with_one_line(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, str(script), url], capture_output=True, text=True, timeout=60,
        check=False))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("worker orders: no Redis at " + url), last
    assert "./scripts/run" in last and "STATEWORKER_REDIS_URL" in last


WAITING_WORKER = """
import sys
from stateworker import Worker
worker = Worker("orders", sys.argv[1])  # waits for its Redis as long as it takes

@worker.function("orders::create")
async def create(body, call):
    return body

worker.serve()
"""


def wait_for_line(process: subprocess.Popen[str], text: str, timeout_s: float) -> str:
    """The first stderr line holding `text`; fails after `timeout_s`."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], deadline - time.monotonic())
        if ready:
            line = process.stderr.readline()
            assert line, "the worker ended before saying so"
            if text in line:
                return line
    raise AssertionError(f"no line with {text!r} within {timeout_s} s")


async def test_worker_serve_waiting_for_redis_stops_on_sigterm(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    script = tmp_path / "worker.py"
    script.write_text(WAITING_WORKER)
    process = subprocess.Popen(
        [sys.executable, str(script), url], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        line = await anyio.to_thread.run_sync(wait_for_line, process, "waiting for it", 30)
        logged = msgspec.json.decode(line)  # one JSON log line, naming the URL and what to do
        assert logged["level"] == "warning" and url in logged["msg"]
        assert "./scripts/run" in logged["msg"]
        process.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: process.wait(timeout=10)) == 0
        assert process.stderr is not None
        assert "Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()
        if process.stderr is not None:
            process.stderr.close()


# ---- BUSY: Redis running a script past its time limit ----------------------------------------
async def answers_busy(port: int) -> bool:
    return (await ping_error(port, read_timeout_s=5)).startswith("BUSY ")


async def test_calls_ride_out_a_busy_redis(tmp_path: Path, prefix: str, scope: str) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        with server.client() as admin:
            admin.config_set("busy-reply-threshold", 100)  # BUSY after 100 ms of a script
        settings = settings_for(server, prefix)
        outcomes: Counter[str] = Counter()
        busy = anyio.Event()

        def run_busy_script() -> None:
            with server.client() as blocker:
                busy_for_ms = 1200
                blocker.eval(BUSY_SCRIPT, 0, busy_for_ms)

        async def caller(client: StateClient, key: str) -> None:
            await busy.wait()
            for _ in range(5):
                try:
                    await client.update(scope, key, [{"type": "increment", "path": "n", "by": 1}])
                    outcomes["OK"] += 1
                except StateError as exc:
                    outcomes[exc.code] += 1

        async with StateService.running(settings, BusOptions(block_ms=50)), \
                StateClient(settings=settings, timeout=10) as client:
            await client.set(scope, "probe", {"n": 0})
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(caller, client, f"k{i}")
                tg.start_soon(anyio.to_thread.run_sync, run_busy_script)
                with anyio.fail_after(10):
                    while not await answers_busy(server.port):
                        await anyio.sleep(0.005)  # polling until Redis answers BUSY
                busy.set()  # the callers go now, while the script still runs
                assert (await client.get(scope, "probe")) == {"n": 0}  # sent during BUSY
            assert outcomes == {"OK": 20}, outcomes  # no INTERNAL, no UNAVAILABLE
            assert client.transient["BUSY"] >= 1
            assert [(await client.get(scope, f"k{i}"))["n"] for i in range(4)] == [5] * 4
    finally:
        server.kill()
