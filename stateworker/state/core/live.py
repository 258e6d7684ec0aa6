"""Live settings: what `state::on-config-change` changes on a running service, on every replica.

The settings iii treats as live (settings.LIVE: `max_value_bytes`, `triggers_enabled`) may be
overridden in Redis (`KeySpace.live_settings`, a hash: name -> value text). A call of
`state::on-config-change` stores the overrides it gives (none: iii's `{}`, a plain reload) and
appends a `settings` entry to the registry stream, in one step (config.lua, run by
config.py); every replica's registry follower then reloads the hash (`LiveSettings.reload`),
as it does at start and after a reconnect, so an override outlives restarts. A stored value
that is bad (written by hand, past the function) leaves the settings in force as they are
and is reported: a warning on every replica, and the call that asked for the reload fails
naming it (a call that removes it, `{"max_value_bytes": null}`, repairs it).

`RedisState.settings` is the holder's current Settings, and the trigger dispatcher's copy of
the state (`on_own_connection`) shares the holder: every `state.settings.<field>` read sees
a change at once, the hot paths unchanged. The overrides live in Redis only: PostgreSQL's
snapshot does not keep them.
"""

from __future__ import annotations

import logging

from stateworker.errors import ConfigError
from stateworker.settings import Settings, with_live
from stateworker.state.core.registry import RegistryEntry
from stateworker.transport.connection import RedisConnection

log = logging.getLogger("stateworker.state.core.live")

KIND = "settings"  # the registry entries of live settings


class LiveSettings:
    """The settings in force on this replica: `base` (read at start) with Redis's overrides."""

    def __init__(self, conn: RedisConnection, key: str, base: Settings) -> None:
        self._conn = conn
        self.key = key
        self.base = base
        self.current = base
        self.problem: str | None = None  # why the stored overrides were refused, last reload

    def install(self, overrides: dict[str, str]) -> Settings:
        """Put `overrides` in force; a bad one raises ConfigError and changes nothing."""
        self.current = with_live(self.base, overrides)
        self.problem = None
        return self.current

    async def reload(self) -> None:
        """Read the overrides from Redis; bad ones keep the settings in force (logged)."""
        flat = await self._conn.execute("HGETALL", self.key)
        text = [item.decode(errors="replace") for item in flat]
        try:
            self.install(dict(zip(text[::2], text[1::2], strict=True)))
        except ConfigError as exc:
            self.problem = str(exc)
            log.warning("live settings in %s refused, the settings in force stay: %s",
                        self.key, exc, extra={"event": "settings.refused"})

    async def apply(self, entry: RegistryEntry) -> None:
        """A `settings` registry entry: the hash changed; read it again."""
        await self.reload()
