"""stateworker: durable, reactive key/value state over Redis streams and Lua."""

from stateworker.bus.client import StateClient
from stateworker.bus.worker import Worker
from stateworker.engines.catalog import CATALOG, SPECS
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
from stateworker.specs import NATIVE
from stateworker.state.api import StateStore
from stateworker.state.core.access import Access
from stateworker.state.core.results import BarrierOutcome, Entry, SetOutcome, Swap

# The engines plugged into the layers below them: an in-process StateStore serves what the
# bus service serves (the engines' functions, and KeeperHub's isolation on the native ones);
# moco's error is mapped back to its class by every client (engines/moco/rules.py registers it).
StateStore.catalog = CATALOG
Access.specs = (*NATIVE, *SPECS)  # which function is a read, for the roles' families

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
