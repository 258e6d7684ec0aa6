"""stateworker: durable, reactive key/value state over Redis streams and Lua."""

from stateworker.errors import (
    Conflict,
    DeadlineExceeded,
    InvalidRequest,
    KeyTooLong,
    NotFound,
    ReservedScope,
    StateError,
    Unavailable,
    UnknownFunction,
    ValueTooLarge,
)
from stateworker.settings import Settings
from stateworker.state.api import ABSENT, Entry, SetOutcome, StateStore, Swap
from stateworker.state.schemas import Event

__all__ = [
    "ABSENT",
    "Conflict",
    "DeadlineExceeded",
    "Entry",
    "Event",
    "InvalidRequest",
    "KeyTooLong",
    "NotFound",
    "ReservedScope",
    "SetOutcome",
    "Settings",
    "StateError",
    "StateStore",
    "Swap",
    "Unavailable",
    "UnknownFunction",
    "ValueTooLarge",
]
