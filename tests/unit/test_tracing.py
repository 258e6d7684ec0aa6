"""tracing.py's pure parts: a call context's W3C trace fields written (`inject`) and read back
(`extract`), and the writer argument that carries a traced call's traceparent into its
script (bindings.writer_arg; entry.lua reads it, tests/integration/reactive/test_traces.py)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from stateworker import tracing
from stateworker.scripts.bindings import writer_arg

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def remote_span(state: TraceState | None = None) -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=True,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED),
                                        trace_state=state))


def test_inject_adds_the_current_span_and_keeps_the_callers_fields() -> None:
    context = {"execution_id": "run-1"}
    with trace.use_span(remote_span(TraceState([("vendor", "x")]))):
        assert tracing.is_traced()
        injected = tracing.inject(context)
    assert injected == {"execution_id": "run-1", "traceparent": TRACEPARENT,
                        "tracestate": "vendor=x"}
    assert context == {"execution_id": "run-1"}, "the caller's mapping is not changed"
    with trace.use_span(remote_span()):
        assert tracing.inject(None) == {"traceparent": TRACEPARENT}


def test_without_a_current_span_nothing_is_added() -> None:
    context = {"execution_id": "run-1"}
    assert not tracing.is_traced()
    assert tracing.inject(context) is context
    assert tracing.inject(None) is None


def test_extract_round_trips_what_inject_wrote() -> None:
    with trace.use_span(remote_span(TraceState([("vendor", "x")]))):
        injected = tracing.inject({})
    assert injected is not None
    parent = tracing.extract(injected)
    assert parent is not None
    span_context = trace.get_current_span(parent).get_span_context()
    assert (span_context.trace_id, span_context.span_id) == (TRACE_ID, SPAN_ID)
    assert span_context.is_remote and span_context.trace_flags.sampled
    assert span_context.trace_state == TraceState([("vendor", "x")])
    assert tracing.traceparent(NonRecordingSpan(span_context)) == TRACEPARENT
    assert tracing.carried(NonRecordingSpan(span_context)) == injected


def test_extract_gives_none_for_no_or_no_valid_trace_context() -> None:
    for context in ({}, {"execution_id": "x"}, {"traceparent": "00-not-a-trace"},
                    {"traceparent": 7}, {"traceparent": None},
                    {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},  # all-zero id
                    {"tracestate": "vendor=x"}):
        assert tracing.extract(context) is None, context
    assert tracing.traceparent(trace.INVALID_SPAN) is None


def test_a_delivery_span_continues_a_valid_parent_only() -> None:
    assert tracing.start_delivery("r::f", "junk", "id", "t") is None
    span = tracing.start_delivery("r::f", TRACEPARENT, "id", "t")
    assert span is not None
    span.end()
    # (its own span id with an SDK provider installed, the parent's without one: the API's
    # tracer carries the caller's context on)
    assert (tracing.traceparent(span) or "").startswith(TRACEPARENT[:36])


def test_the_writer_argument_is_the_writer_unless_traced() -> None:
    assert writer_arg(None) == ""
    assert writer_arg("billing") == "billing"
    assert writer_arg("billing", TRACEPARENT) == f"\0{TRACEPARENT}\0billing"
    assert writer_arg(None, TRACEPARENT) == f"\0{TRACEPARENT}\0"
    # a writer that begins with NUL is never read as a trace: an empty traceparent first
    assert writer_arg("\0x") == "\0\0\0x"
