"""What `acl` mode's checks (state/guard.py) ask of the roles cache (state/access.py builds
it from Redis): an interface of its own, so the state holds the cache without importing it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class AccessPolicy(Protocol):
    """What the roles cache answers (state/access.py builds it from Redis)."""

    def principals(self) -> frozenset[str]: ...

    def check(self, principal: str, fn: str, scopes: Sequence[str] | None) -> None:
        """Raise PermissionDenied when `fn` is not granted on every scope (None: a function
        that names no scope)."""

    def check_context(self, principal: str, context: Mapping[str, Any]) -> None:
        """Raise PermissionDenied when the context names a user it may not act for."""

    def is_admin(self, principal: str) -> bool: ...

    def acts_for_others(self, principal: str) -> bool:
        """An engine principal (it has `act_as`): the writer its context names is kept."""
