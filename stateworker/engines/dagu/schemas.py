"""Dagu's state steps: the request (a step's `with:` fields) and the actions' outputs, field
for field as Dagu's executor writes them."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, Raw, Struct, UnsetType


# ---- the request ---------------------------------------------------------------------------------
class DaguRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """A state step's `with:` fields, every one for every action, as Dagu's executor takes
    them (an unknown field is refused: Dagu decodes with ErrorUnused). `null` is "not given"
    except for `value` and `default`, where `null` is the value."""

    scope: str | None = None
    namespace: str | None = None
    key: str | None = None
    prefix: str | None = None
    value: Raw | UnsetType = UNSET
    default: Raw | UnsetType = UNSET
    expected_version: int | str | None = None  # Dagu decodes weakly: "3" is 3
    create_only: bool | None = None
    required: bool | None = None
    update: bool | None = None
    limit: int | None = None
    include_values: bool | None = None


# ---- Dagu's outputs ------------------------------------------------------------------------------
class Placed(Struct, kw_only=True):
    operation: str
    scope: str
    namespace: str


class Keyed(Placed, kw_only=True):
    key: str


class GetOutput(Keyed, kw_only=True, omit_defaults=True):
    found: bool
    version: int | UnsetType = UNSET
    hash: str | UnsetType = UNSET
    value: Raw | UnsetType = UNSET  # a miss: the default, when one was given


class SetOutput(Keyed, kw_only=True):
    version: int
    hash: str
    created: bool


class DeleteOutput(Keyed, kw_only=True):
    deleted: bool


class ListedOutput(Struct, kw_only=True, omit_defaults=True):
    scope: str
    namespace: str
    key: str
    version: int
    hash: str
    created_at: str = msgspec.field(name="createdAt")
    updated_at: str = msgspec.field(name="updatedAt")
    value: Raw | UnsetType = UNSET  # only with include_values


class ListOutput(Placed, kw_only=True, omit_defaults=True):
    prefix: str = ""
    entries: list[ListedOutput]


class DiffOutput(Keyed, kw_only=True, omit_defaults=True):
    changed: bool
    found_previous: bool = msgspec.field(name="foundPrevious")
    previous_version: int = msgspec.field(default=0, name="previousVersion")
    version: int = 0
    hash: str = ""
    previous: Raw | UnsetType = UNSET
    current: Raw
