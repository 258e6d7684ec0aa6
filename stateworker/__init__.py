"""stateworker: durable, reactive key/value state over Redis streams and Lua.

The public names are imported on first use (a module `__getattr__`): `python -m stateworker`
imports this package first, and a short command (`stateworker get`) would otherwise pay for
the engines and the server side it never runs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stateworker.errors import ERROR_HOMES as _ERROR_HOMES

if TYPE_CHECKING:
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

_ERRORS = ("BarrierConfig", "Compacted", "Conflict", "DeadlineExceeded", "InvalidContext",
           "InvalidRequest", "KeyLimit", "KeyTooLong", "NotFound", "ReservedScope",
           "StateError", "Unavailable", "UnknownField", "UnknownFunction", "ValueTooLarge")
# Each public name and the module that defines it (the TYPE_CHECKING imports above, for mypy).
_HOME: dict[str, str] = {
    "StateClient": "stateworker.bus.client",
    "Worker": "stateworker.bus.worker",
    "StateStore": "stateworker.engines.catalog",
    "ReservedNamespaceError": "stateworker.engines.moco.rules",
    **dict.fromkeys(_ERRORS, "stateworker.errors"),
    "Bookmark": "stateworker.events.model",
    "Event": "stateworker.events.model",
    "ABSENT": "stateworker.pyvalues",
    "Settings": "stateworker.settings",
    **dict.fromkeys(("BarrierOutcome", "Entry", "SetOutcome", "Swap"),
                    "stateworker.state.core.results"),
}

# An engine's error code maps to its class in every process (errors.error_from), imported at
# its first reply rather than at start.
_ERROR_HOMES["ReservedNamespaceError"] = _HOME["ReservedNamespaceError"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
