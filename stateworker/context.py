"""Who makes a call and under which promises: what a bus entry carries besides its body.

A leaf: the bus parses it from an entry, the state operations record its writer and honour
its call id and deadline.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct


class Answer(Struct, frozen=True):
    """Where a bus call's own script writes its reply (the fused path: where the reply list
    shares the node with the state, always on one Redis, on a cluster when the layout puts
    them together): the reply list, the call's stream ("" when the stream is on another node:
    the service acknowledges the entry), its entry id, the consumer group that read it, the
    reply list's expiry and the reply document's head (`{"id":<id>,"ok":true,"result":`). The
    script LPUSHes the reply and acknowledges and deletes the entry: what the service's flush
    did in a second round trip (scripts/lua/includes/answer.lua). `check`: on a cluster the
    script first asks whether the names are on its node (a map gone stale), and leaves the
    reply to the service when not."""

    reply: bytes
    stream: str
    entry_id: bytes
    group: str
    ttl_ms: int
    head: bytes
    check: bool = False
    publish: bool = False


class CallContext(Struct, frozen=True, kw_only=True):
    """Who makes a call: the bus entry's `caller` and `context` fields."""

    caller: str | None = None
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    call_id: str | None = None  # a bus call's id: its reply is recorded with its change
    deadline_ms: int | None = None  # a bus call's deadline (epoch ms), checked by its plan
    call_digest: str | None = None  # SHA-1 hex of fn + canonical body (bus.entries.call_digest)
    # Set for a call to a private namespace's accessor (`<prefix>::state::get` ...): its
    # functions prefix. Its scope must be one the namespace claimed (state/core/validate.py).
    namespace: str | None = None
    # `acl` mode: the principal the call came from, taken from the name of the stream it was
    # read from (keys.principal_stream), never from a field of the entry. None: `off` mode or
    # an in-process call (a trusted caller).
    principal: str | None = None
    # `acl` mode, set when the call is admitted (state/core/guard.py): the function id the
    # principal called (what its grants are checked against) and the writer recorded.
    function: str | None = None
    writer: str | None = None
    # Set by a service that lets a script answer its call itself (bus/runtime.py): a
    # function whose script can write its reply (state::set) does so; the others ignore it.
    answer: Answer | None = None
    # A traced bus call (its context names a `traceparent`): the traceparent of the service's
    # span of it (tracing.py), which the call's scripts write into its events (`tp`), so a
    # trigger delivery continues the trace. None: untraced (the events carry none).
    trace: str | None = None

    @property
    def by(self) -> str | None:
        """The writer recorded as `updated_by` and in events: execution id, else caller (in
        `acl` mode: the principal, `writer`)."""
        if self.writer is not None:
            return self.writer
        execution = self.context.get("execution_id")
        if isinstance(execution, str) and execution:
            return execution
        return self.caller or None


NO_CONTEXT = CallContext()
