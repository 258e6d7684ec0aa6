"""OpenTelemetry traces: a caller's W3C trace context (`traceparent`, `tracestate` in a call's
`context`) carried through the service, its script and the trigger deliveries it causes.

A leaf: the bus (runtime, client, worker) and the dispatcher use it; it imports only the
OpenTelemetry API (the SDK and the OTLP exporter only in `setup_export`, when asked for).

What a span costs: an untraced call (no `traceparent` in its context) is a dict lookup in the
service and never reaches this module; spans are made only for calls that carry a valid
trace context. Without an SDK provider (`setup_export` not called, or the embedding program
installed none) the API's tracer makes non-recording spans that carry the caller's context
on, so a trace still continues through a service that exports nothing.

The spans (docs/bus-protocol.md, "Traces"):
    client    CLIENT    `<fn>`            StateClient.call_json under a current span
    service   SERVER    `<fn>`            the state service, a traced bus call
    delivery  PRODUCER  `deliver <fn>`    the dispatcher, a trigger call of a traced event
    worker    SERVER    `<fn>`            a Worker's function (CONSUMER for a trigger call,
                                          which has no reply list)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import msgspec
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from stateworker.context import CallContext

TRACEPARENT = "traceparent"  # the context field of a call's trace (W3C trace context)
TRACESTATE = "tracestate"
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"  # set: `stateworker serve` exports its spans
OK = "OK"  # the result code of a span whose call succeeded (else the error's code)

# The attributes every call span carries (besides its name, the function id).
CALL_ID = "stateworker.call_id"
CALLER = "stateworker.caller"
CODE = "stateworker.code"
TRIGGER = "stateworker.trigger_id"

log = logging.getLogger("stateworker.tracing")
# A proxy of the global provider: spans go to whichever provider is set, even one set after
# this import (a test's, an embedding program's).
tracer = trace.get_tracer("stateworker")
_propagator = TraceContextTextMapPropagator()


def is_traced() -> bool:
    """Whether a valid span is current (a call made now continues its trace)."""
    return trace.get_current_span().get_span_context().is_valid


def inject(context: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """`context` with the current span's `traceparent` (and `tracestate`) added, when a
    valid span is current; else `context` itself (the caller's fields are never changed)."""
    if not is_traced():
        return context
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return {**(context or {}), **carrier}


def extract(context: Mapping[str, Any]) -> Context | None:
    """The parent a call's context names (`traceparent`, `tracestate`), or None when it
    names none or one that is not valid W3C trace context (a caller's mistake starts no
    trace: the call is served untraced)."""
    carrier = {name: value for name in (TRACEPARENT, TRACESTATE)
               if isinstance(value := context.get(name), str)}
    if TRACEPARENT not in carrier:
        return None
    parent = _propagator.extract(carrier)
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return parent


def traceparent(span: Span) -> str | None:
    """The `traceparent` naming `span` as the parent (version 00: 55 characters), or None
    for a span that is no valid one."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def carried(span: Span) -> dict[str, str]:
    """A call context's trace fields naming `span` as the parent (empty for an invalid one)."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, trace.set_span_in_context(span))
    return carrier


def start_call(fn: str, ctx: CallContext, call_id: str | None) -> tuple[Span | None, CallContext]:
    """The span of a bus call a service serves (SERVER, started, not made current: a batch
    runs many calls in one task), child of the caller's span its context names, and the
    call's context carrying it on (`trace`: what the call's scripts write into its events).
    No span, and the context as it was, when the context names no valid parent."""
    parent = extract(ctx.context)
    if parent is None:
        return None, ctx
    span = tracer.start_span(fn, parent, SpanKind.SERVER, _attributes(call_id, ctx.caller))
    return span, msgspec.structs.replace(ctx, trace=traceparent(span))


def finish(span: Span, code: str) -> None:
    """End a call's span with its result code (`OK` or the error's code)."""
    span.set_attribute(CODE, code)
    if code != OK:
        span.set_status(Status(StatusCode.ERROR, code))
    span.end()


@contextmanager
def serving(fn: str, context: Mapping[str, Any], call_id: str | None, caller: str | None,
            kind: SpanKind = SpanKind.SERVER) -> Iterator[Span | None]:
    """The span of a call served in a task of its own (a Worker's function), current while
    the block runs, so the spans the function makes (and the calls it sends) nest under it.
    Yields None, and does nothing, when the context names no valid parent. The code of an
    exception leaving the block (`code` attribute, else INTERNAL) is the span's result."""
    parent = extract(context)
    if parent is None:
        yield None
        return
    with tracer.start_as_current_span(fn, parent, kind, _attributes(call_id, caller),
                                      record_exception=True,
                                      set_status_on_exception=False) as span, _ending(span):
        yield span


@contextmanager
def calling(fn: str, call_id: str) -> Iterator[Span | None]:
    """A client's span of one call (current while the block runs; its traceparent is what
    the call's context carries), or None when no valid span is current: an untraced caller
    makes none."""
    if not is_traced():
        yield None
        return
    with tracer.start_as_current_span(fn, kind=SpanKind.CLIENT,
                                      attributes={CALL_ID: call_id},
                                      set_status_on_exception=False) as span, _ending(span):
        yield span


@contextmanager
def _ending(span: Span) -> Iterator[None]:
    """The block's outcome as the span's code: OK, or the exception's (finish_failed)."""
    try:
        yield
    except BaseException as exc:
        finish_failed(span, exc)
        raise
    span.set_attribute(CODE, OK)


def start_delivery(fn: str, parent_traceparent: str, call_id: str, trigger_id: str
                   ) -> Span | None:
    """The dispatcher's span of one trigger call (PRODUCER, `deliver <fn>`), child of the
    span of the call that wrote the event (its `traceparent`); None when that is not valid."""
    parent = extract({TRACEPARENT: parent_traceparent})
    if parent is None:
        return None
    return tracer.start_span(f"deliver {fn}", parent, SpanKind.PRODUCER,
                             {CALL_ID: call_id, TRIGGER: trigger_id})


def finish_failed(span: Span, exc: BaseException) -> None:
    """Mark a span ended by an exception: its code (a StateError's, else INTERNAL; a
    cancellation is CANCELLED), an error status. The span is ended by its block."""
    code = getattr(exc, "code", None)
    if not isinstance(code, str):
        code = "CANCELLED" if not isinstance(exc, Exception) else "INTERNAL"
    span.set_attribute(CODE, code)
    span.set_status(Status(StatusCode.ERROR, code))


def _attributes(call_id: str | None, caller: str | None) -> dict[str, str]:
    attributes = {}
    if call_id is not None:
        attributes[CALL_ID] = call_id
    if caller:
        attributes[CALLER] = caller
    return attributes


class Export:
    """The SDK provider `setup_export` installed: `shutdown()` exports what is left."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def shutdown(self) -> None:
        """Flush the spans not exported yet and stop the exporter (at the service's stop)."""
        self.provider.shutdown()


def setup_export(service_name: str = "stateworker") -> Export | None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set: install the official SDK's TracerProvider as the
    global one, exporting in batches over OTLP/HTTP (the exporter reads the OTEL_EXPORTER_
    OTLP_* variables itself: endpoint, headers, timeout); the resource from OTEL_SERVICE_NAME
    and OTEL_RESOURCE_ATTRIBUTES, `service.name` `service_name` when neither names one.
    Without it: nothing (None), and the global provider is whatever the program set (the
    API's no-op one by default). The SDK is imported only here: a service that does not
    export never loads it."""
    if not os.environ.get(ENDPOINT_VARIABLE):
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("exporting traces to %s", os.environ[ENDPOINT_VARIABLE],
             extra={"event": "tracing.export"})
    return Export(provider)
