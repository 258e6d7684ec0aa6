"""The shapes of the functions around the data rather than of it: a namespace's scopes claimed
and released (`acl` mode's private scopes), and the console's files (ui-content).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from stateworker.schemas.base import Request


# ---- namespaces --------------------------------------------------------------------------------
class ClaimNamespaceRequest(Request):
    # Any: a wrong type is INVALID_PREFIX / INVALID_SCOPE (validate.py), not INVALID_REQUEST.
    # The claimant is the call's `caller`, never a body field (iii's `_caller_worker_id` is
    # accepted and ignored: a body is whatever the caller writes).
    functions_prefix: Any
    scopes: list[Any]
    # An admin takes public scopes in use (entries, a trigger, a recent write) on purpose:
    # logged, and named in the registry entry. Without it such a scope is SCOPE_IN_USE.
    adopt: bool = False
    caller_worker_id: Any = msgspec.field(default=UNSET, name="_caller_worker_id")


class ReleaseNamespaceRequest(Request, kw_only=True):
    # Any: a wrong type is INVALID_SCOPE (validate.py), as for claim-namespace. The releaser
    # is the call's `caller` (`acl`: its principal), which must own every scope, unless an
    # admin says `force` (iii's `_caller_worker_id`: accepted and ignored, as for a claim).
    scopes: list[Any]
    force: bool = False
    caller_worker_id: Any = msgspec.field(default=UNSET, name="_caller_worker_id")


class ClaimResult(Struct, omit_defaults=True):
    claimed: bool  # false when the namespace already owned every scope asked for
    scopes: list[str]  # every scope the namespace owns, byte-sorted
    functions: list[str]  # its accessors
    adopted: list[str] | UnsetType = UNSET  # the scopes in use an admin adopted (`adopt`)


class ReleaseResult(Struct):
    released: list[str]  # the scopes made public again, byte-sorted
    scopes: list[str]  # every scope the caller's namespace still owns, byte-sorted


# ---- the console's files -----------------------------------------------------------------------
class UiContentRequest(Request):
    path: str  # a console file, e.g. "state/console.js" (uicontent.py)


class UiContentResult(Struct):
    content: str  # the file, verbatim
    content_type: str


# ---- state::on-config-change (the live settings) ------------------------------------------------
class ConfigChangeRequest(Request, kw_only=True):
    """state::on-config-change: iii's takes `{}` (a reload); the live settings given are stored
    first, null removing an override (the setting's value at start comes back)."""

    max_value_bytes: int | UnsetType | None = UNSET
    triggers_enabled: bool | UnsetType | None = UNSET


class ConfigChangeResult(Struct):
    ok: bool
    max_value_bytes: int  # the settings now in force on the replica that served the call
    triggers_enabled: bool
