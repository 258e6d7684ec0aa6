"""What `StateStore`'s typed methods return, and the conversions from the operations' results.

The Structs are what callers get back (`SetOutcome`, `Swap`, `Entry` and `BarrierOutcome` are
exported from `stateworker`; `Claim` is only returned). The operations answer with the
JSON-shaped results of schemas/, values kept as raw JSON; the conversions here decode those
values (tagged datetime, Decimal, UUID, bytes ... back to their types, codec.py) and turn
unset fields into None.
"""

from __future__ import annotations

from typing import Any

import msgspec

from stateworker import pyvalues
from stateworker.schemas import BarrierDecision, EntryResult, SetResult, SwapResult


class SetOutcome(msgspec.Struct, frozen=True):
    """What `set` did: the value before (None: absent) and after, the entry's new version and
    hash, and whether the key was new."""

    old_value: Any
    new_value: Any
    version: int
    hash: str
    created: bool


class Swap(msgspec.Struct, frozen=True):
    """What `compare_and_set` did: swapped, or not with the value found (None: absent)."""

    swapped: bool
    current: Any = None


class Claim(msgspec.Struct, frozen=True):
    """What `claim_namespace` did, and what the namespace owns now."""

    claimed: bool  # False when the namespace already owned every scope asked for
    scopes: list[str]  # every scope the namespace owns, byte-sorted
    functions: list[str]  # its accessors: <prefix>::state::get, ::list, ::list_keys, ::compare-and-set
    adopted: list[str] = []  # the scopes in use an admin adopted (`adopt=True`), byte-sorted


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """An entry with its metadata (`get_entry`); a missing key has `found=False`, its
    `value` the default asked for and every other field None."""

    found: bool
    value: Any = None
    version: int | None = None
    hash: str | None = None
    topic: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    expires_at: str | None = None
    updated_by: str | None = None
    revision: str | None = None


class BarrierOutcome(msgspec.Struct, frozen=True):
    """A barrier's decision on one arrival (`barrier`)."""

    decision: str  # "allow" (once per barrier) or "skip"
    reason: str
    payload: Any = None  # allow: {"results": {key: carried value, ...}}


def py_value(raw: msgspec.Raw) -> Any:
    """A stored value's JSON as its Python value (tagged types converted back)."""
    return pyvalues.decode_value(bytes(raw))


def set_outcome(result: SetResult) -> SetOutcome:
    return SetOutcome(py_value(result.old_value), py_value(result.new_value), result.version,
                      result.hash, result.created)


def swap(result: SwapResult) -> Swap:
    if result.swapped:
        return Swap(True)
    assert isinstance(result.current, msgspec.Raw)
    return Swap(False, py_value(result.current))


def entry(result: EntryResult) -> Entry:
    def opt(value: Any) -> Any:
        return None if value is msgspec.UNSET else value

    value = None if result.value is msgspec.UNSET else py_value(result.value)
    return Entry(
        found=result.found, value=value, version=opt(result.version), hash=opt(result.hash),
        topic=opt(result.topic), created_at=opt(result.created_at),
        updated_at=opt(result.updated_at), expires_at=opt(result.expires_at),
        updated_by=opt(result.updated_by), revision=opt(result.revision),
    )


def barrier_outcome(result: BarrierDecision) -> BarrierOutcome:
    payload = None if result.payload is msgspec.UNSET else py_value(result.payload)
    return BarrierOutcome(result.decision, result.reason, payload)
