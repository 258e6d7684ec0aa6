"""`/metrics` of a running service, parsed by the Prometheus client's own parser: the bus's
calls and latency per function (the names nobody serves under one label), every call
stream's backlog (the service's and each trigger target's, shard by shard), the dispatch's
counters, the process's and the build's figures; every family it shows is documented."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stateworker import Worker
from stateworker.app.cli.parser import version
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions
from stateworker.clock import now_ms
from stateworker.errors import StateError
from stateworker.events.model import revision_of
from stateworker.keys import bus_shard_stream
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.integration.http.conftest import Samples, http_settings, post, samples, serving
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio

WAIT_S = 10  # the dispatch's counters reach Redis once a round (1 s)


async def scraped(http: httpx.AsyncClient) -> Samples:
    return samples((await http.get("/metrics")).text)


async def test_metrics_move_with_calls(redis_server: RedisServer,
                                       served: tuple[StateService, httpx.AsyncClient],
                                       prefix: str, scope: str) -> None:
    service, http = served
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    async with StateClient(settings=settings) as client:
        for i in range(5):
            await client.call_json("state::set", msgspec.json.encode(
                {"scope": scope, "key": f"k{i}", "value": i}))
        with pytest.raises(StateError):
            await client.call_json("state::get", b'{"scope": 1}')
    for _ in range(3):
        await post(http, "state::get", {"scope": scope, "key": "k1"})
    await post(http, "state::get", {"scope": 1})
    await post(http, "state::set", {"scope": scope, "key": "h", "value": 1},
               **{"Idempotency-Key": "metrics-1"})
    response = await http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain")
    got = samples(response.text)
    bus = "stateworker_bus_calls_total"
    assert got[(bus, (("code", "OK"), ("function", "state::set")))] == 5
    assert got[(bus, (("code", "INVALID_REQUEST"), ("function", "state::get")))] == 1
    # The bus's latency, a histogram per function called (and none for the others).
    seconds = "stateworker_bus_call_seconds"
    assert got[(f"{seconds}_count", (("function", "state::set"),))] == 5
    assert got[(f"{seconds}_bucket", (("function", "state::set"), ("le", "+Inf")))] == 5
    assert got[(f"{seconds}_count", (("function", "state::get"),))] == 1
    assert got[(f"{seconds}_sum", (("function", "state::set"),))] > 0
    assert {labels for name, labels in got if name == f"{seconds}_count"} == {
        (("function", "state::set"),), (("function", "state::get"),)}
    http_calls = "stateworker_http_calls_total"
    assert got[(http_calls, (("code", "OK"), ("function", "state::get")))] == 3
    assert got[(http_calls, (("code", "INVALID_REQUEST"), ("function", "state::get")))] == 1
    assert got[("stateworker_http_call_seconds_count", (("function", "state::get"),))] == 4
    assert got[("stateworker_redis_up", ())] == 1
    stream = (("principal", ""), ("service", service.bus.service), ("shard", "0"))
    assert got[("stateworker_bus_pending", stream)] == 0
    assert got[("stateworker_bus_lag_entries", stream)] == 0
    assert got[("stateworker_bus_lag_seconds", stream)] == 0
    # The call ids held: the 5 bus sets' and the HTTP set's (the refused get bound none).
    assert got[("stateworker_dedupe_records", ())] == 6
    # Every family the page shows is in docs/http.md's table of metrics.
    documented = (Path(__file__).parents[3] / "docs" / "http.md").read_text()
    families = {family.name for family in text_string_to_metric_families(response.text)
                if not family.name.endswith("_created")}  # (the client's own timestamps)
    assert families and {name for name in families if f"`{name}" not in documented} == set()


async def test_unknown_function_names_share_one_metric_label(
        served: tuple[StateService, httpx.AsyncClient], redis_server: RedisServer,
        prefix: str) -> None:
    """Callers choose the names they call: those the service does not serve are counted
    under one label, `other`, so /metrics does not grow with them."""
    _, http = served
    for i in range(3):
        status, _ = await post(http, f"junk::{i}", {})
        assert status == 404
    async with StateClient(settings=Settings(redis_url=redis_server.url, prefix=prefix)) as c:
        for i in range(2):
            with pytest.raises(StateError):
                await c.call_json(f"junk::bus{i}", b"{}")
    got = await scraped(http)
    unknown = (("code", "UNKNOWN_FUNCTION"), ("function", "other"))
    assert got[("stateworker_http_calls_total", unknown)] == 3
    assert got[("stateworker_bus_calls_total", unknown)] == 2
    assert got[("stateworker_bus_call_seconds_count", (("function", "other"),))] == 2
    assert got[("stateworker_http_call_seconds_count", (("function", "other"),))] == 3
    assert not any("junk" in value for _, labels in got for _, value in labels)


async def test_metrics_show_the_dispatch(served: tuple[StateService, httpx.AsyncClient],
                                         scope: str) -> None:
    _, http = served
    status, _ = await post(http, "state::register-trigger", {
        "id": "watch", "function_id": "reactor::on_change", "service": "reactor",
        "config": {"scope": scope}})
    assert status == 200
    for i in range(3):
        await post(http, "state::set", {"scope": scope, "key": f"k{i}", "value": i})
    await post(http, "state::set", {"scope": f"{scope}-other", "key": "k", "value": 1})
    got: Samples = {}

    async def counted(name: str, labels: tuple[tuple[str, str], ...], value: float) -> bool:
        nonlocal got
        got = await scraped(http)
        return got.get((name, labels)) == value

    await until(lambda: counted("stateworker_dispatch_handler_calls_total", (), 3), WAIT_S,
                "the dispatch's handler calls counted")
    # A family per counter, each there from the start.
    assert got[("stateworker_dispatch_condition_skips_total", ())] == 0
    assert got[("stateworker_dispatch_malformed_events_total", ())] == 0
    assert not any(name.startswith("stateworker_dispatch_total") for name, _ in got)
    assert got[("stateworker_triggers", ())] == 1
    lagged = {labels for name, labels in got if name == "stateworker_dispatch_lag_events"}
    assert lagged == {(("partition", str(n)),) for n in range(4)}
    assert not any(name.startswith("stateworker_snapshot") for name, _ in got)  # none runs
    trigger = (("trigger", "watch"),)
    # (its figures reach Redis with the dispatch's counters)
    await until(lambda: counted("stateworker_trigger_calls_total", trigger, 3), WAIT_S,
                "the trigger's calls counted")
    assert got[("stateworker_trigger_lag_events", trigger)] == 0



def stream_of(service: str, shard: int) -> tuple[tuple[str, str], ...]:
    """The labels of a service's shard's backlog."""
    return (("principal", ""), ("service", service), ("shard", str(shard)))


async def test_every_trigger_target_stream_shows_its_backlog(redis_server: RedisServer,
                                                             prefix: str, scope: str) -> None:
    """Two shards a service: the calls a trigger hands to a service nobody serves wait
    unread (lag) on the shard of the scope's partition; those to a service whose handler
    holds them are read, not acknowledged (pending) until it answers."""
    settings = http_settings(redis_server.url, prefix, bus_shards=2)
    release = anyio.Event()
    worker = Worker("holder", settings=settings, options=BusOptions(block_ms=50))

    @worker.function("holder::on_change")
    async def on_change(body: dict[str, Any], call: Any) -> None:
        await release.wait()  # answers when the test says so

    async with serving(settings) as (service, http), anyio.create_task_group() as tg:
        await tg.start(worker.run)
        try:
            for service_name in ("nobody", "holder"):
                status, _ = await post(http, "state::register-trigger", {
                    "id": service_name, "function_id": f"{service_name}::on_change",
                    "service": service_name, "config": {"scope": scope}})
                assert status == 200
            got = await scraped(http)
            # Every shard of every service, a trigger target's from its registration on.
            for service_name in ("state", "nobody", "holder"):
                for shard in (0, 1):
                    assert got[("stateworker_bus_lag_entries", stream_of(service_name, shard))] \
                        == got[("stateworker_bus_pending", stream_of(service_name, shard))] == 0
            for i in range(3):
                await post(http, "state::set", {"scope": scope, "key": f"k{i}", "value": i})
            shard, idle = (n := service.state.keys.partition_of(scope) % 2), 1 - n

            def figure(name: str, service_name: str, at: int = shard) -> float | None:
                return got.get((f"stateworker_bus_{name}", stream_of(service_name, at)))

            async def backlog() -> bool:
                nonlocal got
                got = await scraped(http)
                unread, held = figure("lag_entries", "holder"), figure("pending", "holder")
                return figure("lag_entries", "nobody") == 3 and unread is not None \
                    and held is not None and held >= 1 and unread + held == 3  # (read or not)

            await until(backlog, WAIT_S, "3 calls for each target")
            assert figure("pending", "nobody") == 0
            # The age of each one's oldest call (unread, or read and held): its first entry's.
            before, got, after = now_ms(), await scraped(http), now_ms()
            for service_name in ("nobody", "holder"):
                first, = await service.state.conn.execute("XRANGE", bus_shard_stream(
                    prefix, service_name, shard), "-", "+", "COUNT", 1)
                added = revision_of(first[0])[0]
                assert (before - added) / 1000 <= (figure("lag_seconds", service_name) or -1) \
                    <= (after - added) / 1000
            for service_name in ("nobody", "holder"):  # (the scope's shard alone)
                assert figure("lag_entries", service_name, idle) == 0
                assert figure("pending", service_name, idle) == 0
            release.set()

            async def answered() -> bool:
                nonlocal got
                got = await scraped(http)
                return figure("pending", "holder") == figure("lag_entries", "holder") == 0

            await until(answered, WAIT_S, "the held calls answered")
            assert figure("lag_seconds", "holder") == 0 and figure("lag_entries", "nobody") == 3
        finally:
            release.set()
            worker.stop()


async def test_the_process_and_the_build_are_shown(
        served: tuple[StateService, httpx.AsyncClient]) -> None:
    _, http = served
    got = await scraped(http)
    build = (("python", platform.python_version()), ("version", version()))
    assert got[("stateworker_build_info", build)] == 1
    assert got[("process_resident_memory_bytes", ())] > 0
    assert got[("process_open_fds", ())] > 0
    assert ("process_cpu_seconds_total", ()) in got
    assert any(name == "python_info" for name, _ in got)
