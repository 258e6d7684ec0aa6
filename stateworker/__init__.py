"""stateworker: durable, reactive key/value state over Redis streams and Lua."""

from stateworker.bus.client import StateClient
from stateworker.bus.worker import Worker
from stateworker.engines.catalog import StateStore
from stateworker.engines.moco.rules import ReservedNamespaceError
from stateworker.errors import (
    BarrierConfig,
    Compacted,
    Conflict,
    DeadlineExceeded,
    InvalidContext,
    InvalidRequest,
    KeyLimit,
    KeyTooLong,
    NotFound,
    ReservedScope,
    StateError,
    Unavailable,
    UnknownField,
    UnknownFunction,
    ValueTooLarge,
)
from stateworker.events.model import Bookmark, Event
from stateworker.pyvalues import ABSENT
from stateworker.settings import Settings
from stateworker.state.core.results import BarrierOutcome, Entry, SetOutcome, Swap

__all__ = [
    "ABSENT",
    "BarrierConfig",
    "BarrierOutcome",
    "Bookmark",
    "Compacted",
    "Conflict",
    "DeadlineExceeded",
    "Entry",
    "Event",
    "InvalidContext",
    "InvalidRequest",
    "KeyLimit",
    "KeyTooLong",
    "NotFound",
    "ReservedNamespaceError",
    "ReservedScope",
    "SetOutcome",
    "Settings",
    "StateClient",
    "StateError",
    "StateStore",
    "Swap",
    "Unavailable",
    "UnknownField",
    "UnknownFunction",
    "ValueTooLarge",
    "Worker",
]
