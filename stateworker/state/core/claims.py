"""The claims cache: which scopes private namespaces own, held in memory on every replica.

Redis holds the claims in one hash (`KeySpace.claims`: scope -> functions prefix), written
only by claim.lua, which also XADDs a registry entry `{kind: claims, prefix, scopes}` (the new
scopes, a JSON array; an adoption adds `adopted` and `by`), and release.lua, whose entry is
`{kind: claims, released, by}` (`released`: a JSON object, scope -> the namespace it was
released from). The cache is loaded when the state opens and after every reconnect of the
registry follower (registry.py), updated at once on the replica that served a claim or
release and by the follower on the others.

Applying is idempotent both ways (registry.py: entries after a reload's noted id are applied
again over it): a claim sets its scopes' owner, a release drops a scope only while the
namespace it was released from still owns it, so a release applied again after the scope
was claimed anew (by anyone) leaves the new claim alone.

Every public function asks it (`validate.scope`) on each call, hence a dict lookup and no
round trip; the trigger dispatcher asks `is_claimed` / `owner` too.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from stateworker.state.core.registry import RegistryEntry
from stateworker.transport.connection import RedisConnection

KIND = "claims"  # the registry entries of claims


class Claims:
    """Claimed scope -> the functions prefix of the namespace owning it."""

    def __init__(self, conn: RedisConnection, key: str) -> None:
        self._conn = conn
        self.key = key
        self._owners: dict[str, str] = {}
        self._prefixes: set[str] = set()
        self.scopes: frozenset[str] = frozenset()  # every claimed scope

    def is_claimed(self, scope: str) -> bool:
        return scope in self._owners

    def owner(self, scope: str) -> str | None:
        """The functions prefix owning `scope`, None when it is public."""
        return self._owners.get(scope)

    def owns_any(self, prefix: str) -> bool:
        """Whether `prefix` is a namespace (it claimed at least one scope)."""
        return prefix in self._prefixes

    def add(self, prefix: str, scopes: Iterable[str]) -> None:
        for scope in scopes:
            self._owners[scope] = prefix
        self._changed()

    async def reload(self) -> None:
        """Read every claim from Redis (replacing what is held: the hash is the truth)."""
        flat = await self._conn.execute("HGETALL", self.key)
        text = [item.decode() for item in flat]
        self._owners = dict(zip(text[::2], text[1::2], strict=True))
        self._changed()

    def remove(self, released: dict[str, str]) -> None:
        """Drop each released scope (scope -> the owner it was released from) that owner
        still holds."""
        for scope, owner in released.items():
            if self._owners.get(scope) == owner:
                del self._owners[scope]
        self._changed()

    async def apply(self, entry: RegistryEntry) -> None:
        """A claim or release another replica served (a registry entry of kind `claims`)."""
        released = entry.fields.get("released")
        if released is not None:
            self.remove(msgspec.json.decode(released, type=dict[str, str]))
            return
        scopes = msgspec.json.decode(entry.fields["scopes"], type=list[str])
        self.add(entry.fields["prefix"], scopes)

    def _changed(self) -> None:
        self._prefixes = set(self._owners.values())
        self.scopes = frozenset(self._owners)
