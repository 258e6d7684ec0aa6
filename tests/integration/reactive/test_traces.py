"""OpenTelemetry traces through the service: a trace a client starts continues through the
state service's span, the script's event (`tp`), the trigger delivery and the Worker's handler,
each span the child of the one before (the official SDK's in-memory exporter)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind

from stateworker import Worker, tracing
from stateworker.app.service import StateService
from stateworker.bus.client import StateClient
from stateworker.bus.protocol import BusOptions, Call
from stateworker.errors import InvalidRequest
from stateworker.settings import Settings
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="session")
def session_exporter() -> InMemorySpanExporter:
    """The SDK provider of the whole test process (the global provider can be set once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    assert trace.get_tracer_provider() is provider, "another global provider was set first"
    return exporter


@pytest.fixture
def spans(session_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    session_exporter.clear()
    yield session_exporter
    session_exporter.clear()


class Reactor:
    """The trigger's target: a Worker function that keeps the span it ran in and the call's
    context, makes a span of its own (which must nest under it) and says it ran."""

    def __init__(self, settings: Settings) -> None:
        self.worker = Worker("reactor", settings=settings, options=BusOptions(block_ms=50))
        self.seen: list[tuple[SpanContext, dict[str, Any], dict[str, Any]]] = []
        self.ran = anyio.Event()

        @self.worker.function("reactor::on_change")
        async def on_change(body: dict[str, Any], call: Call) -> None:
            with trace.get_tracer("test").start_as_current_span("handler work"):
                pass
            self.seen.append((trace.get_current_span().get_span_context(), call.ctx.context,
                              body))
            self.ran.set()


def named(spans: InMemorySpanExporter, name: str, kind: SpanKind) -> ReadableSpan:
    """The one span of that name and kind."""
    found = [s for s in spans.get_finished_spans() if s.name == name and s.kind is kind]
    assert len(found) == 1, (name, [(s.name, s.kind) for s in spans.get_finished_spans()])
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def traceparent(context: SpanContext) -> str:
    """W3C trace context naming `context` as the parent (its flags as the SDK set them)."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


async def test_a_client_trace_continues_through_the_service_and_a_triggered_handler(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str,
        spans: InMemorySpanExporter) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    reactor = Reactor(settings)
    async with StateClient(settings=settings, caller="writer") as client, \
            anyio.create_task_group() as tg:
        await tg.start(reactor.worker.run)
        await client.call("state::register-trigger", {
            "id": "traced", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        spans.clear()  # (the registration was not traced: it made no span either)
        with trace.get_tracer("test").start_as_current_span("job") as job:
            await client.set(scope, "k", {"n": 1})
        with anyio.fail_after(10):
            await reactor.ran.wait()
        # (a span ends after its call is answered: state::set's script answers it itself)
        await until(lambda: len(spans.get_finished_spans()) >= 6, 5, "every span to end")
        reactor.worker.stop()

    trace_id = job.get_span_context().trace_id
    handler_context, call_context, body = reactor.seen[0]
    assert body["key"] == "k"
    assert handler_context.trace_id == trace_id, "the handler runs in the job's trace"
    # job -> client call -> service -> delivery -> handler -> the handler's own span
    client_span = named(spans, "state::set", SpanKind.CLIENT)
    service_span = named(spans, "state::set", SpanKind.SERVER)
    delivery = named(spans, "deliver reactor::on_change", SpanKind.PRODUCER)
    handler = named(spans, "reactor::on_change", SpanKind.CONSUMER)
    work = named(spans, "handler work", SpanKind.INTERNAL)
    assert len(spans.get_finished_spans()) == 6  # (and the job's)
    assert parent_of(client_span) == job.get_span_context().span_id
    assert parent_of(service_span) == span_id(client_span)
    assert parent_of(delivery) == span_id(service_span)
    assert parent_of(handler) == span_id(delivery)
    assert parent_of(work) == span_id(handler)
    assert handler_context.span_id == span_id(handler)
    chain = [client_span, service_span, delivery, handler, work]
    assert {s.context.trace_id for s in chain if s.context is not None} == {trace_id}
    # what each span says of its call
    attributes = dict(service_span.attributes or {})
    assert attributes["stateworker.code"] == "OK"
    assert attributes["stateworker.caller"] == "writer"
    assert attributes["stateworker.call_id"] == dict(client_span.attributes or {})[
        "stateworker.call_id"]
    assert dict(delivery.attributes or {})["stateworker.trigger_id"] == "traced"
    assert delivery.context is not None
    assert call_context["traceparent"] == traceparent(delivery.context), call_context
    assert "tp" not in body and "traceparent" not in body, "the event document is unchanged"


async def test_an_untraced_call_makes_no_span_and_its_event_no_trace(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str,
        spans: InMemorySpanExporter) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    reactor = Reactor(settings)
    async with StateClient(settings=settings) as client, anyio.create_task_group() as tg:
        await tg.start(reactor.worker.run)
        await client.call("state::register-trigger", {
            "id": "plain", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        await client.set(scope, "k", 1)
        # a traceparent that is no W3C trace context starts no trace: served untraced
        await client.call("state::set", {"scope": scope, "key": "bad", "value": 2},
                          context={"traceparent": "00-not-a-trace"})
        with anyio.fail_after(10):
            while len(reactor.seen) < 2:
                reactor.ran = anyio.Event()
                await reactor.ran.wait()
        reactor.worker.stop()
    assert [context for _, context, _ in reactor.seen] == [{}, {}]
    assert all(not context.is_valid for context, _, _ in reactor.seen)
    assert [s.name for s in spans.get_finished_spans()] == ["handler work"] * 2
    events = await service.state.conn.execute(
        "XRANGE", service.state.keys.for_scope(scope).events, "-", "+")
    assert [b"tp" in fields[::2] for _, fields in events] == [False, False]


# Every script that writes events carries a traced call's traceparent into each of them
# (set and update answer their call in their script on one Redis; the others do not).
WRITES: list[tuple[str, dict[str, Any], int]] = [
    ("state::set", {"key": "a", "value": 1}, 1),
    ("state::update", {"key": "a", "ops": [{"type": "increment", "path": "", "by": 1}]}, 1),
    ("state::update-topic", {"key": "a", "topic": "t"}, 1),
    ("state::transaction", {"ops": [{"op": "set", "key": "b", "value": 1},
                                    {"op": "delete", "key": "a"}]}, 2),
    ("state::delete-by-topic", {"topic_pattern": "*"}, 1),
    ("state::delete-by-prefix", {"prefix": "b"}, 1),
]


async def test_every_writing_script_puts_the_service_span_in_its_events(
        service: StateService, client: StateClient, scope: str,
        spans: InMemorySpanExporter) -> None:
    events_key = service.state.keys.for_scope(scope).events
    await client.call("state::set", {"scope": scope, "key": "t1", "value": 1,
                                     "topic": "t"})  # (for delete-by-topic)
    for fn, body, count in WRITES:
        before = await service.state.conn.execute("XRANGE", events_key, "-", "+")
        spans.clear()
        with trace.get_tracer("test").start_as_current_span("job"):
            await client.call(fn, {"scope": scope, **body})
        # (the service span ends once the service has the script's reply: after the call's
        # own reply when the script answered it, on one Redis state::set and state::update)
        await until(lambda: any(s.kind is SpanKind.SERVER for s in spans.get_finished_spans()),
                    5, f"the service span of {fn}")
        served = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
        assert [s.name for s in served] == [fn]
        context = served[0].context
        assert context is not None
        expected = traceparent(context).encode()
        events = (await service.state.conn.execute("XRANGE", events_key, "-", "+"))[len(before):]
        assert len(events) == count, fn
        for _, flat in events:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            assert fields[b"tp"] == expected, (fn, fields)
            assert fields[b"by"] == b"", fn  # (the writer stays apart from the trace)


async def test_a_writer_that_begins_with_nul_is_no_trace(
        service: StateService, redis_server: RedisServer, prefix: str, scope: str) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
    async with StateClient(settings=settings, caller="\0" + "x" * 60) as client:
        await client.set(scope, "k", 1)
        entry = await client.call("state::get-entry", {"scope": scope, "key": "k"})
    events = await service.state.conn.execute(
        "XRANGE", service.state.keys.for_scope(scope).events, "-", "+")
    fields = dict(zip(events[0][1][::2], events[0][1][1::2], strict=True))
    assert b"tp" not in fields
    assert fields[b"by"] == b"\0" + b"x" * 60
    assert entry["updated_by"] == "\0" + "x" * 60


async def test_an_http_call_continues_the_trace_of_its_traceparent_header(
        redis_server: RedisServer, prefix: str, scope: str,
        spans: InMemorySpanExporter) -> None:
    settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4,
                        http="127.0.0.1:0")
    reactor = Reactor(settings)
    async with StateService.running(settings, BusOptions(block_ms=50)) as served, \
            StateClient(settings=settings) as client, anyio.create_task_group() as tg, \
            httpx.AsyncClient(base_url=f"http://{served.http_address}") as http:
        await tg.start(reactor.worker.run)
        await client.call("state::register-trigger", {
            "id": "web", "function_id": "reactor::on_change", "service": "reactor",
            "config": {"scope": scope}})
        spans.clear()
        with trace.get_tracer("test").start_as_current_span("web job") as job:
            reply = await http.post("/v1/call/state::set", content=msgspec.json.encode(
                {"scope": scope, "key": "k", "value": 1}),
                headers={"traceparent": traceparent(job.get_span_context())})
        assert reply.json()["ok"] is True
        refused = await http.post("/v1/call/state::get", content=b'{"scope": 1}',
                                  headers={"traceparent": traceparent(job.get_span_context())})
        assert refused.status_code == 400
        with anyio.fail_after(10):
            await reactor.ran.wait()
        await until(lambda: len(spans.get_finished_spans()) >= 6, 5, "every span to end")
        reactor.worker.stop()
    service_span = named(spans, "state::set", SpanKind.SERVER)
    delivery = named(spans, "deliver reactor::on_change", SpanKind.PRODUCER)
    handler = named(spans, "reactor::on_change", SpanKind.CONSUMER)
    assert parent_of(service_span) == job.get_span_context().span_id
    assert parent_of(delivery) == span_id(service_span)
    assert parent_of(handler) == span_id(delivery)
    failed = named(spans, "state::get", SpanKind.SERVER)  # the refused call: its code
    assert dict(failed.attributes or {})["stateworker.code"] == "INVALID_REQUEST"
    assert parent_of(failed) == job.get_span_context().span_id


def test_a_span_ends_with_its_blocks_outcome(spans: InMemorySpanExporter) -> None:
    """A client's and a served function's span carry the code of what ended them: OK, a
    StateError's code, INTERNAL for any other exception; an error status when not OK."""
    with trace.get_tracer("test").start_as_current_span("job") as job:
        with pytest.raises(InvalidRequest), tracing.calling("x::refused", "id-1"):
            raise InvalidRequest("bad", {})
        with tracing.calling("x::fine", "id-2"):
            pass
    context = {"traceparent": traceparent(job.get_span_context())}
    with pytest.raises(RuntimeError), tracing.serving("x::crashed", context, "id-3", "me"):
        raise RuntimeError("boom")
    with tracing.serving("x::served", context, "id-4", "me"):
        pass
    codes = {s.name: (dict(s.attributes or {})["stateworker.code"], s.status.status_code.name)
             for s in spans.get_finished_spans() if s.name.startswith("x::")}
    assert codes == {"x::refused": ("INVALID_REQUEST", "ERROR"), "x::fine": ("OK", "UNSET"),
                     "x::crashed": ("INTERNAL", "ERROR"), "x::served": ("OK", "UNSET")}
