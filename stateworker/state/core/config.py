"""`state::on-config-change`: the live settings' overrides stored, every replica reloading them
(live.py says how the settings in force follow them)."""

from __future__ import annotations

import msgspec

from stateworker.context import CallContext
from stateworker.errors import ConfigError, InvalidRequest, shown
from stateworker.schemas import ConfigChangeRequest, ConfigChangeResult
from stateworker.scripts.bindings import CONFIG, config_call
from stateworker.scripts.replies import ConfigReply
from stateworker.settings import LIVE, with_live
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan


def _text(name: str, value: int | bool) -> str:
    return ("true" if value else "false") if name == "triggers_enabled" else str(value)


def state_on_config_change(state: RedisState, req: ConfigChangeRequest,
                           ctx: CallContext) -> Plan:
    """Store the overrides given (null: remove one), make every replica reload them, and
    answer with this replica's settings once it reloaded."""
    given = {name: getattr(req, name) for name in LIVE
             if getattr(req, name) is not msgspec.UNSET}
    try:
        with_live(state.live.base, {n: _text(n, v) for n, v in given.items() if v is not None})
    except ConfigError as exc:
        raise InvalidRequest(f"$.max_value_bytes: {exc}", {"path": "$.max_value_bytes"}) from exc
    overrides = [(name, "" if value is None else _text(name, value))
                 for name, value in given.items()]

    def finish(reply: ConfigReply) -> ConfigChangeResult:
        try:
            now = state.live.install(reply.overrides)
        except ConfigError as exc:
            raise InvalidRequest(
                f"the live settings stored in {shown(state.keys.live_settings)} are refused: "
                f"{exc}; every replica keeps the settings in force (remove the override with "
                "state::on-config-change, its field null)",
                {"path": "$", "key": state.keys.live_settings}) from exc
        return ConfigChangeResult(True, now.max_value_bytes, now.triggers_enabled)

    return state.script_plan(CONFIG, config_call(state.keys, overrides), finish)
