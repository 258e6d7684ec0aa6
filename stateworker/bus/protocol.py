"""The bus protocol (version 1, docs/bus-protocol.md): read calls from a service's stream with a consumer
group, run them concurrently, reply, then acknowledge.

- Calls are read in batches; their Redis work is issued in the same event-loop tick, so the
  lean connection sends it as one pipeline. Replies, acknowledgements and deletions of finished
  calls are written by one flusher, grouped (one LPUSH per reply list, one XACK and one XDEL
  for all), so a batch costs a few round trips, not a few per call.
- An entry is acknowledged only after its reply is written. A consumer that dies leaves its
  entries pending; after `visibility_timeout_ms` another consumer (or the same one restarted)
  takes them over with XAUTOCLAIM. Exactly-once effects come from the call id: the state
  scripts record a call's reply with its change; a user worker records replies here.
- Bad input never stops the service: every malformed entry gets an error reply (when it names
  a reply list) and is acknowledged.
- Stopping: intake stops, calls in flight finish within the grace period, then the rest is
  cancelled (and stays pending for a later reclaim).

Here: the options (`BusOptions`), a call as read (`Call`), what a service gives the runtime
(`Handler`: one call at a time; `BatchHandler`: calls as plans, run together), the names
(`Bus`, from keys.py), the call entry (`call_entry` writes it; bus/entries.py reads it) and
the reply document (`reply_document` writes it, `parse_reply` reads it). The loops:
bus/runtime.py.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from opentelemetry.trace import Span

from stateworker.bus.ids import body_partition
from stateworker.context import CallContext
from stateworker.errors import (
    ConfigError,
    StateError,
    shown,
)
from stateworker.keys import (
    PRINCIPAL_RE,
    BusKeys,
    KeySpace,
    bus_shard_stream,
    bus_stream,
    principal_reply_prefix,
    principal_stream,
    reply_prefix,
)
from stateworker.settings import Settings
from stateworker.transport.connection import shown_url, url_user
from stateworker.transport.plans import Plan, Sent
from stateworker.transport.wire import Arg

log = logging.getLogger("stateworker.bus")


# A consumer of a group with nothing pending is removed once idle this long (XINFO CONSUMERS
# `idle`), or DEAD_CONSUMER_TIMEOUTS visibility timeouts if longer (decision 0068). Removing a
# live one loses nothing (it had nothing pending; its next read that gets an entry makes it
# again), so the bound only keeps a live consumer from being removed and made again over and
# over: on Redis 7.0 `idle` counts from its last read that got entries (a quiet service's
# consumer ages as long as no call comes), on 7.2+ from its last read (every `block_ms`). A
# restart's leftovers go within about this long; `status` lists those that served in it.
DEAD_CONSUMER_MS = 600_000
DEAD_CONSUMER_TIMEOUTS = 20


class BusOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How one service reads and answers its stream."""

    concurrency: int = 1024  # calls in flight at most
    read_count: int = 16  # entries per XREADGROUP
    block_ms: int = 200  # how long a read waits; also how soon a stop is noticed
    visibility_timeout_ms: int = 30_000  # a pending entry idle this long is taken over
    reply_ttl_ms: int = 300_000  # reply lists expire after this
    grace_s: float = 10.0  # on stop, how long calls in flight may take
    max_body_bytes: int = 5 * 1024 * 1024
    max_context_bytes: int = 64 * 1024  # who makes the call, not data: ids and names
    # A reply document larger is answered CALL_TOO_LARGE instead: below Redis's
    # proto-max-bulk-len (512 MB by default), past which its LPUSH would drop the connection
    # and leave the call pending, read and run again in a loop.
    max_reply_bytes: int = 256 * 1024 * 1024
    consumer: str = ""  # default: <hostname>-<pid>
    # A consumer with nothing pending idle longer is removed (None: DEAD_CONSUMER_MS, or
    # DEAD_CONSUMER_TIMEOUTS visibility timeouts if longer)
    dead_consumer_ms: int | None = None

    @property
    def dead_after_ms(self) -> int:
        """How long a consumer with nothing pending stays idle before it is removed."""
        if self.dead_consumer_ms is not None:
            return self.dead_consumer_ms
        return max(DEAD_CONSUMER_MS, DEAD_CONSUMER_TIMEOUTS * self.visibility_timeout_ms)


# Where an entry was read: (its stream, its entry id). Entry ids of two streams may be equal,
# so an entry is acknowledged, deleted and told apart by both.
Ref = tuple[str, bytes]


@dataclass(slots=True)
class Call:
    """One bus call as read from the stream."""

    ref: Ref
    id: str | None
    fn: str
    body: bytes
    reply: bytes  # reply list key; b"" for fire-and-forget
    deadline_ms: int | None
    ctx: CallContext
    started: float = field(default_factory=time.perf_counter)
    span: Span | None = None  # a traced call's span in a service (tracing.start_call)
    msgpack: bool = False  # `fmt msgpack`: its body was msgpack, its reply is (bus/formats.py)

    @property
    def entry_id(self) -> bytes:
        return self.ref[1]


Handler = Callable[[Call], Awaitable[bytes]]  # -> result JSON; raises StateError


class BatchHandler(Protocol):
    """Calls as plans: `prepare` validates (raising StateError) and gives the call's Plan,
    whose result is the reply's JSON; `execute_many` runs plans together."""

    def prepare(self, call: Call) -> Plan: ...

    @property
    def answers_in_script(self) -> frozenset[str]:
        """The functions whose script writes the call's reply and acknowledges its entry
        itself (context.Answer); such a plan's result is plans.ANSWERED."""

    def send(self, plans: Sequence[Plan]) -> Sent:
        """Put the plans' first step on the wire now; the token goes to execute_many."""

    async def execute_many(self, plans: Sequence[Plan], sent: Sent,
                           done: Callable[[int, Any], None],
                           after_step: Callable[[], Awaitable[None]]) -> list[Any]: ...


class Bus(BusKeys):
    """One service's names (keys.BusKeys) and where it may reply."""

    def __init__(self, prefix: str, service: str, shards: int = 1) -> None:
        super().__init__(prefix, service, shards)
        self._replies = self.reply_prefix.encode()

    def reply_allowed(self, key: bytes) -> bool:
        """Replies go only to this prefix's reply lists (`<prefix>:reply:...`): a caller can
        never make the service write to, or set an expiry on, a key it does not own."""
        return key.startswith(self._replies) and len(key) > len(self._replies)


def caller_route(settings: Settings, url: str, service: str) -> tuple[str, str, str | None]:
    """Where a caller of `service` writes its calls and reads its replies: (call stream,
    reply list prefix, principal). `off` mode: the service's stream and `<prefix>:reply:`;
    `acl` mode: the principal's own stream and reply lists, the principal being the Redis
    user the URL authenticates as (the only streams and lists its ACL user may use).

    Raises:
        ConfigError: `acl` mode and the URL names no user, or not a principal's name."""
    prefix = settings.prefix
    if settings.auth != "acl":
        return bus_stream(prefix, service), reply_prefix(prefix), None
    principal = url_user(url)
    if principal is None or not PRINCIPAL_RE.match(principal):
        raise ConfigError(
            f"STATEWORKER_AUTH=acl: the Redis URL {shown(shown_url(url))} must name the principal's "
            "Redis user (redis://<principal>:<password>@host:port; a principal is 1-64 of "
            "[A-Za-z0-9_-], made with `stateworker principal add`)")
    return (principal_stream(prefix, service, principal),
            principal_reply_prefix(prefix, principal), principal)


class Shards:
    """The call streams a caller writes one service's calls to, and the rule that picks one
    per call (docs/bus-protocol.md, "Shards"): a call whose body is a JSON object with a text
    `scope` goes to shard `partition_of(scope) % shards` (its state's partition: on a Redis
    Cluster the same slot as its state when that shard is the partition's), any other call
    to shard `crc32(call id) % shards`. A retry keeps its id and body, so its shard."""

    def __init__(self, streams: Sequence[str], partitions: int) -> None:
        self.streams = list(streams)
        self.keys = KeySpace("", partitions)  # (partitions and ids' homes: no prefix needed)

    def stream_for(self, body: Arg, call_id: str) -> str:
        """The stream of the call with `body` and `call_id` (one shard: no look at the body)."""
        if len(self.streams) == 1:
            return self.streams[0]
        return self.stream_at(body_partition(self.keys, body), call_id)

    def stream_at(self, partition: int | None, call_id: str) -> str:
        """The stream of a call whose body names a scope of `partition` (None: no scope)."""
        streams = self.streams
        if partition is not None:
            return streams[partition % len(streams)]
        return streams[zlib.crc32(call_id.encode()) % len(streams)]


def caller_shards(settings: Settings, service: str, stream: str) -> Shards:
    """Where a caller sends its calls to `service`: its `caller_route` stream alone in `acl`
    mode (a principal's stream is not sharded), else the `bus_shards` shards of the service."""
    if settings.auth == "acl" or settings.bus_shards == 1:
        return Shards([stream], settings.partitions)
    return Shards([bus_shard_stream(settings.prefix, service, n)
                   for n in range(settings.bus_shards)], settings.partitions)


def call_entry(stream: str, call_id: str, fn: str, body: Arg, reply: str,
               deadline_ms: int | None = None, caller: str | None = None,
               context: Mapping[str, Any] | None = None, publish: bool = False) -> list[Arg]:
    """The XADD of one call (docs/bus-protocol.md, "A call"): `id fn body reply`, then the optional
    `deadline_ms`, `caller` and `context` (a JSON object), each only when given. `reply` is
    the reply list's key, "" for fire-and-forget. Built as one list, as the client's send path
    did inline: a caller's call costs nothing more for it."""
    command: list[Arg]
    if deadline_ms is None:
        command = ["XADD", stream, "*", "id", call_id, "fn", fn, "body", body, "reply", reply]
    else:  # (the client's case: one list, built at once)
        command = ["XADD", stream, "*", "id", call_id, "fn", fn, "body", body, "reply", reply,
                   "deadline_ms", deadline_ms]
    if caller:
        command += ["caller", caller]
    if context:
        command += ["context", msgspec.json.encode(dict(context))]
    if publish:
        command += ["publish", "1"]
    return command


def reply_document(call_id: str | None, result: bytes | None, error: StateError | None) -> bytes:
    """`{"id":…,"ok":true,"result":…}` or `{"id":…,"ok":false,"error":{code, message,
    details}}`; `result` is JSON already, written as it is (never decoded and encoded again)."""
    if error is None:
        assert result is not None
        return reply_head(call_id) + result + b"}"
    return (b'{"id":' + msgspec.json.encode(call_id) + b',"ok":false,"error":' +
            msgspec.json.encode(error.to_dict()) + b"}")


def reply_head(call_id: str | None) -> bytes:
    """A success reply document up to its result: `{"id":…,"ok":true,"result":` (a script
    that answers its call itself writes the rest: context.Answer)."""
    return b'{"id":' + msgspec.json.encode(call_id) + b',"ok":true,"result":'


class Reply(msgspec.Struct):
    """A reply document as read (`parse_reply`); `result` stays JSON text."""

    id: str | None
    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: dict[str, Any] = msgspec.field(default_factory=dict)


_reply_decoder = msgspec.json.Decoder(Reply)


def parse_reply(document: bytes) -> Reply | None:
    """A reply document as a Reply; None when it is not one (a foreign push to the list)."""
    try:
        return _reply_decoder.decode(document)
    except msgspec.DecodeError:
        return None


def unreadable_reply(document: bytes) -> Reply | None:
    """A document that is not a reply document (`parse_reply` gives None) but names an id: an
    INTERNAL error reply for that id, naming the document (so its call is answered, not left
    to time out). None when no id can be read from it (a foreign push to the list)."""
    try:
        found = msgspec.json.decode(document)
    except msgspec.DecodeError:
        return None
    call_id = found.get("id") if isinstance(found, dict) else None
    if not isinstance(call_id, str):
        return None
    shown_document = document[:200].decode(errors="replace")
    return Reply(id=call_id, ok=False, error={
        "code": "INTERNAL",
        "message": f"the reply to call {shown(call_id)} is not a reply document (`id`, `ok`, "
                   f"`result` or `error`, an object): {shown_document}"
                   f"{'...' if len(document) > 200 else ''}",
        "details": {"call_id": call_id, "document": shown_document}})


def default_consumer() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
