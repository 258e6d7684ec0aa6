"""One frozen settings object, read from the environment and validated at start."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

import msgspec

from stateworker.error_codes import ERRORS_DOC_URL
from stateworker.errors import ConfigError, shown

_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# What each durability mode asks of Redis's AOF: `fast` fsyncs once a second (a second of
# acknowledged writes at risk when the host dies), `strict` before every reply.
APPENDFSYNC = {"fast": "everysec", "strict": "always"}
_FOREVER = float("inf")
# HOST:PORT of the HTTP face: a name or IPv4 address, or an IPv6 one in brackets; 0-65535.
_HTTP_BIND = re.compile(
    r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]?\d{1,4})")
# `off`: every caller is trusted (one deployment); `acl`: every caller is a principal with a
# Redis ACL user of its own, and its identity comes from the stream it may write to.
AUTH_MODES = ("off", "acl")
# A service's call streams at most: each one more XREADGROUP stream, XAUTOCLAIM and consumer
# group per replica; 64 spread the calls over far more primaries than a cluster here has.
MAX_BUS_SHARDS = 64
# A replica is live while its last heartbeat (keys.replicas) is within this many lease times
# (`lease_ms`): the leases' share (reactive/leases.py) and the upgrade's check (state/kv/repack.py).
LIVE_LEASES = 3
# A partition's event bytes at most (events_max_bytes): far past any Redis's memory.
MAX_EVENTS_BYTES = 1 << 40
# Replicas a strict write waits for at most: more than a primary has makes every write time out.
MAX_STRICT_REPLICAS = 16
# The HTTP face's connections at most (a file descriptor each: the kernel's own bound)
MAX_HTTP_CONNECTIONS = 1 << 20

# The default dedupe window: how long a call's record (its reply, by id) is kept. A client
# that cannot read its service's window re-sends within half of it at most (bus/resends.py).
DEDUPE_WINDOW_MS = 15 * 60 * 1000


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the store and the service read from their environment."""

    redis_url: str | None = None  # None: start and manage an embedded redis-server
    # The bus on a Redis of its own (call streams, their groups, reply lists, trigger
    # targets' streams): it needs no fsync per write, since a call's record is the state
    # Redis's (docs/decisions/0056). None: the bus shares the state's Redis.
    bus_redis_url: str | None = None
    # Embedded Redis data (AOF) and socket: one well-known place per user, whatever the
    # current directory, so `serve`, `call`, `status` and StateStore.open() agree.
    state_dir: str = msgspec.field(default_factory=lambda: default_state_dir(os.environ))
    prefix: str = "sw"  # first segment of every Redis key and stream
    partitions: int = 16  # scopes hash into this many partitions, each one event stream
    # Each service's calls spread over this many streams (keys.bus_shard_stream); the
    # service reads them all, a caller picks one per call (bus/protocol.py, `Shards`).
    bus_shards: int = 1
    max_value_bytes: int = 1024 * 1024
    max_key_bytes: int = 1024
    # One call's values read and written, at most (the stored values its ops read, the new
    # ones they write): what one script may spend on them, about 100 ms at 8 MiB. A
    # transaction, set-many or delete-many over more is CALL_TOO_LARGE (nothing written); a
    # delete-by-prefix or delete-by-topic batch stops there and goes on in the next.
    max_call_bytes: int = 8 * 1024 * 1024
    events_maxlen: int = 100_000  # hard cap of each partition's event stream (approximate)
    # Bytes each partition's event stream may hold (MEMORY USAGE): over it, the events handed
    # on are trimmed before events_retain ends, oldest first; events still owed to triggers or
    # the snapshot are kept (bounded by events_maxlen alone). 64 MiB holds 32 events of the
    # largest values (2 x 1 MiB), ~300,000 small ones (more than events_maxlen: the count
    # cap bounds those first), and 1 GiB in all at 16 partitions.
    events_max_bytes: int = 64 * 1024 * 1024
    # Events the dispatcher has handed on are kept this many seconds more for watches, then
    # trimmed; events not yet dispatched are kept (up to events_maxlen).
    events_retain: float = 3600.0
    dispatch: bool = True  # `serve` runs the trigger dispatcher (replicas share partitions)
    # The dispatcher hands events on to triggers; false: it pauses, events wait in their
    # partitions (none lost, up to events_maxlen). Live: state::on-config-change (LIVE).
    triggers_enabled: bool = True
    # A trigger target's call stream (each shard's) may hold this many entries; beyond, the
    # dispatch of the events calling it waits (reactive/batch.py), so a dead service's stream
    # holds at most this plus one event's calls and never grows Redis without bound.
    trigger_backlog: int = 10_000
    lease_ms: int = 5000  # a dispatcher's hold on a partition; renewed every lease_ms / 5
    # PostgreSQL (libpq URL) that `serve` keeps a continuous snapshot in; None: Redis alone.
    postgres_url: str | None = None
    # At start, a Redis empty of the prefix or behind PostgreSQL is rebuilt from it (restore)
    # before serving; false: the service refuses to start and names `stateworker restore`.
    repair: bool = True
    allow_no_aof: bool = False  # accept an external Redis that has AOF off
    durability: str = "fast"  # "fast" or "strict": see APPENDFSYNC (checked at start)
    # `strict`: a batch is acknowledged once this many replicas have it too (WAIT / WAITAOF
    # on each primary), so a failover loses none of it. None: 1 on a Redis Cluster, 0 on one
    # server (whose replicas, if any, are the operator's).
    strict_replicas: int | None = None
    auth: str = "off"  # "off" or "acl": see AUTH_MODES (docs/security.md)
    reaper_batch: int = 200  # expired entries the reaper deletes per round trip (shared by partitions)
    reaper_interval_s: float = 0.25
    dedupe_window_ms: int = DEDUPE_WINDOW_MS  # a call id's reply is kept (and replayed) this long
    # A completed barrier (state::barrier) is kept this long, then its hash expires with
    # every payload it holds; an arrival after that starts a new barrier of the same id.
    barrier_ttl_s: int = 24 * 3600
    connect_timeout_s: float = 5.0  # opening a Redis connection gives up after this
    read_timeout_s: float = 10.0  # replies outstanding, no byte from Redis this long: reconnect
    watch_progress_s: float = 5.0  # a watch with nothing to hand on this long sends a bookmark
    docs_url: str = ERRORS_DOC_URL  # docs/errors.md as published: op errors' `doc_url` base
    # `serve`'s HTTP face (app/http.py): HOST:PORT it listens on (port 0: one the system
    # picks; the start line says which); None: off.
    http: str | None = None
    # The names (or addresses) the HTTP face answers to, comma-separated; `*`: any; None: the
    # loopback names and the bind address's host (app/hosts.py: DNS rebinding).
    http_hosts: str | None = None
    # Dapr's state stores the HTTP face serves, comma-separated: `name`, `name=scope` or
    # `name=prefix*` (app/dapr_requests.py); None: `statestore`.
    dapr_stores: str | None = None
    # The console's live tails open at once (each holds a Redis connection): in all, and per
    # principal (`off` mode: per client address). Beyond: RESOURCE_EXHAUSTED (app/console.py).
    max_tails: int = 64
    max_tails_per_caller: int = 8
    # The HTTP face's connections open at once, counted as each is accepted (a file
    # descriptor each: app/http_admission.py; fewer when `ulimit -n` cannot hold them beside
    # the process's own), and of them from one client address: one client (a proxy in
    # front is one) cannot take every place. Beyond either: 503 UNAVAILABLE and a close.
    http_max_connections: int = 1024
    http_max_connections_per_client: int = 256

    def __post_init__(self) -> None:
        # One absolute path: every process that reads the same setting finds the same Redis.
        msgspec.structs.force_setattr(self, "state_dir", os.path.abspath(
            os.path.expanduser(self.state_dir)))
        if not _PREFIX_RE.match(self.prefix):
            raise ConfigError(
                f"prefix {shown(self.prefix)} must be 1-64 characters of [A-Za-z0-9_.-]"
            )
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"partitions must be 1..1024, got {self.partitions}")
        if not 1 <= self.bus_shards <= min(MAX_BUS_SHARDS, self.partitions):
            raise ConfigError(
                f"bus_shards (STATEWORKER_BUS_SHARDS) must be 1..{MAX_BUS_SHARDS} and at most "
                f"partitions ({self.partitions}: shard i shares partition i's hash tag), got "
                f"{shown(self.bus_shards)}")
        if self.max_value_bytes < 1 or self.max_key_bytes < 1:
            raise ConfigError("max_value_bytes and max_key_bytes must be positive")
        if not 2 * self.max_value_bytes <= self.max_call_bytes <= 1 << 31:
            raise ConfigError(
                "max_call_bytes (STATEWORKER_MAX_CALL_BYTES) must be at least twice "
                f"max_value_bytes ({2 * self.max_value_bytes}: one update of the largest value "
                f"reads and writes it) and at most 2 GiB, got {shown(self.max_call_bytes)}")
        if self.durability not in APPENDFSYNC:
            raise ConfigError(f"durability must be one of {tuple(APPENDFSYNC)}, got "
                              f"{shown(self.durability)}")
        if self.strict_replicas is not None and not 0 <= self.strict_replicas <= MAX_STRICT_REPLICAS:
            raise ConfigError(
                f"strict_replicas (STATEWORKER_STRICT_REPLICAS) must be 0..{MAX_STRICT_REPLICAS} "
                f"(replicas that confirm a strict write), got {shown(self.strict_replicas)}")
        if self.auth not in AUTH_MODES:
            raise ConfigError(f"auth must be one of {AUTH_MODES}, got {shown(self.auth)}")
        if self.durability == "strict" and self.allow_no_aof:
            raise ConfigError("durability strict needs AOF: unset STATEWORKER_ALLOW_NO_AOF or "
                              "use STATEWORKER_DURABILITY=fast")
        if self.bus_redis_url is not None and self.auth == "acl":
            raise ConfigError(
                "bus_redis_url (STATEWORKER_BUS_REDIS_URL) cannot be used with auth acl "
                "(STATEWORKER_AUTH=acl): acl mode's principals are Redis users of the one Redis "
                "that holds their streams and the state; unset one of the two")
        if self.dedupe_window_ms < 1000:
            raise ConfigError(f"dedupe_window_ms must be at least 1000, got {self.dedupe_window_ms}")
        if not 1 <= self.trigger_backlog <= 10_000_000:
            raise ConfigError("trigger_backlog (STATEWORKER_TRIGGER_BACKLOG) must be 1..10000000 "
                              f"entries of a target's stream, got {shown(self.trigger_backlog)}")
        if not 1 <= self.barrier_ttl_s <= 10 * 365 * 24 * 3600:
            raise ConfigError("barrier_ttl_s (STATEWORKER_BARRIER_TTL_S) must be 1..315360000 "
                              f"seconds (ten years), got {shown(self.barrier_ttl_s)}")
        if self.max_tails < 1 or self.max_tails_per_caller < 1:
            raise ConfigError("max_tails and max_tails_per_caller must be at least 1")
        for name, value in (("http_max_connections", self.http_max_connections),
                            ("http_max_connections_per_client",
                             self.http_max_connections_per_client)):
            if not 1 <= value <= MAX_HTTP_CONNECTIONS:
                raise ConfigError(f"{name} (STATEWORKER_{name.upper()}) must be "
                                  f"1..{MAX_HTTP_CONNECTIONS} connections, got {shown(value)}")
        if self.events_maxlen < 1 or self.reaper_batch < 1 or self.reaper_interval_s <= 0:
            raise ConfigError("events_maxlen, reaper_batch and reaper_interval_s must be positive")
        if not 2 * self.max_value_bytes <= self.events_max_bytes <= MAX_EVENTS_BYTES:
            raise ConfigError(
                "events_max_bytes (STATEWORKER_EVENTS_MAX_BYTES) must be at least twice "
                f"max_value_bytes ({2 * self.max_value_bytes}: one event holds the old and the "
                f"new value) and at most {MAX_EVENTS_BYTES} (1 TiB), got "
                f"{shown(self.events_max_bytes)}")
        if not 0 <= self.events_retain < _FOREVER:
            raise ConfigError(f"events_retain must be 0 or more seconds, got {self.events_retain}")
        if not 500 <= self.lease_ms <= 600_000:
            raise ConfigError(f"lease_ms must be 500..600000, got {self.lease_ms}")
        if not (0 < self.connect_timeout_s < _FOREVER and 0 < self.read_timeout_s < _FOREVER):
            raise ConfigError(f"connect_timeout_s and read_timeout_s must be positive seconds, got "
                              f"{self.connect_timeout_s} and {self.read_timeout_s}")

        if not 0 < self.watch_progress_s < _FOREVER:
            raise ConfigError(f"watch_progress_s must be a positive number of seconds, got "
                              f"{self.watch_progress_s}")
        if self.http is not None and not _HTTP_BIND.fullmatch(self.http):
            raise ConfigError("http (STATEWORKER_HTTP, serve --http) must be HOST:PORT, e.g. "
                              f"127.0.0.1:8080 or [::1]:8080 (port 0-65535), got {shown(self.http)}")
        if not re.fullmatch(r"https?://[^\s#]+", self.docs_url):
            raise ConfigError("docs_url (STATEWORKER_DOCS_URL) must be an absolute http(s) URL "
                              f"of docs/errors.md without a fragment, got {shown(self.docs_url)}")

    def check_serving(self) -> None:
        """What a service needs of these settings beyond their own checks (a client in `acl`
        mode may keep a shorter window: its re-sends keep to the default's half anyway).

        Raises:
            ConfigError: `acl` mode with a dedupe window shorter than the default: a
                principal may not read the service's window, so its client re-sends within
                half the default (bus/resends.py), and a re-send read after a shorter
                window's record is gone would apply the call twice."""
        if self.auth == "acl" and self.dedupe_window_ms < DEDUPE_WINDOW_MS:
            raise ConfigError(
                f"dedupe_window_ms (STATEWORKER_DEDUPE_WINDOW_MS) must be at least "
                f"{DEDUPE_WINDOW_MS} with auth acl (a principal cannot read the service's "
                f"window and re-sends within half of {DEDUPE_WINDOW_MS} ms), got "
                f"{self.dedupe_window_ms}")

    @property
    def appendfsync(self) -> str:
        """The `appendfsync` the durability mode needs (the embedded Redis runs with it)."""
        return APPENDFSYNC[self.durability]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from `STATEWORKER_*` variables; keyword overrides win over the environment."""
        env = os.environ if env is None else env
        if env.get("STATEWORKER_APPENDFSYNC"):
            raise ConfigError("STATEWORKER_APPENDFSYNC is replaced by STATEWORKER_DURABILITY: "
                              "fast (appendfsync everysec) or strict (appendfsync always)")
        values: dict[str, object] = {"state_dir": default_state_dir(env)}
        for field in msgspec.structs.fields(cls):
            raw = env.get(f"STATEWORKER_{field.name.upper()}")
            if raw is not None and raw != "":
                values[field.name] = _parse(field.name, field.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return msgspec.convert(values, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid setting: {exc}") from exc


# The settings state::on-config-change changes on a running service (state/core/live.py):
# what iii treats as live. Every other setting is read once, at start.
LIVE = ("max_value_bytes", "triggers_enabled")
_WHOLE = re.compile(r"[0-9]{1,12}")


def with_live(base: Settings, overrides: Mapping[str, str]) -> Settings:
    """`base` with the live settings' overrides (name -> value text, as Redis keeps them); a
    bad one raises ConfigError naming it, its value and what it must be."""
    values: dict[str, object] = {}
    for name, raw in overrides.items():
        if name not in LIVE:
            raise ConfigError(f"live setting {shown(name)} is none of {', '.join(LIVE)} (the "
                              "settings that change on a running service)")
        if name == "triggers_enabled":
            values[name] = _parse(name, bool, raw)
        elif _WHOLE.fullmatch(raw):
            values[name] = int(raw)
        else:
            raise ConfigError(f"live setting {name} must be a whole number of bytes, got "
                              f"{shown(raw)}")
    return msgspec.structs.replace(base, **values) if values else base


def default_state_dir(env: Mapping[str, str]) -> str:
    """The per-user data directory: $XDG_DATA_HOME/stateworker, else
    ~/.local/share/stateworker."""
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "stateworker")


def _parse(name: str, type_: object, raw: str) -> object:
    if type_ is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"STATEWORKER_{name.upper()} must be true or false, got {shown(raw)}")
    return raw
