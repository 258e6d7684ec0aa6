"""`stateworker serve` with OTEL_EXPORTER_OTLP_ENDPOINT: the official SDK exports the span of a
traced call over OTLP/HTTP (to a receiver in the test), what is left at the latest at the stop."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from stateworker.bus.client import StateClient
from stateworker.settings import Settings
from tests.servers import RedisServer, ServiceProcess

pytestmark = pytest.mark.anyio

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on the loopback: the export requests it got."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, ExportTraceServiceRequest]] = []
        self.got = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.requests.append((self.path, request))
        self.server.got.set()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # (quiet)
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


async def test_serve_exports_a_traced_calls_span_over_otlp(
        redis_server: RedisServer, prefix: str, scope: str, receiver: Receiver) -> None:
    service = ServiceProcess(redis_server.url, prefix, env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": ""})
    service.start()
    try:
        settings = Settings(redis_url=redis_server.url, prefix=prefix, partitions=4)
        async with StateClient(settings=settings) as client:
            await client.call("state::set", {"scope": scope, "key": "k", "value": 1},
                              context={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
            await client.call("state::get", {"scope": scope, "key": "k"})  # untraced
        service.signal(signal.SIGTERM)
        assert service.wait() == 0
    finally:
        service.kill()
    assert receiver.got.is_set(), "no export request came by the service's stop"
    spans: list[Span] = []
    for path, request in receiver.requests:
        assert path == "/v1/traces"
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value
                          for a in resource_spans.resource.attributes}
            assert attributes["service.name"] == "stateworker"
            spans += [s for scoped in resource_spans.scope_spans for s in scoped.spans]
    assert [(s.name, s.kind) for s in spans] == [("state::set", Span.SPAN_KIND_SERVER)]
    span = spans[0]
    assert (span.trace_id.hex(), span.parent_span_id.hex()) == (TRACE_ID, PARENT_ID)
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert attributes["stateworker.code"] == "OK"
