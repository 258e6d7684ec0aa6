"""STATEWORKER_STRICT_REPLICAS (its limits, from the environment) and what a strict batch is
confirmed with (Confirm: the command, what the start line says, what falls short)."""

from __future__ import annotations

import pytest

from stateworker.errors import ConfigError
from stateworker.settings import MAX_STRICT_REPLICAS, Settings
from stateworker.state.core.confirm import CONFIRM_TIMEOUT_MS, Confirm
from stateworker.transport.wire import ReplyError


@pytest.mark.parametrize("count", [-1, MAX_STRICT_REPLICAS + 1])
def test_strict_replicas_out_of_range_names_the_setting_and_the_limit(count: int) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(strict_replicas=count)
    assert "STATEWORKER_STRICT_REPLICAS" in str(caught.value)
    assert f"0..{MAX_STRICT_REPLICAS}" in str(caught.value) and str(count) in str(caught.value)


def test_strict_replicas_from_the_environment() -> None:
    assert Settings.from_env({"STATEWORKER_STRICT_REPLICAS": "2"}).strict_replicas == 2
    assert Settings.from_env({}).strict_replicas is None  # decided at start: cluster or not


def test_the_confirmation_command_and_its_description() -> None:
    assert not Confirm().needed
    assert Confirm().describe() == "appendfsync always"
    wait = Confirm(replicas=1)
    assert wait.needed and wait.command() == ["WAIT", 1, CONFIRM_TIMEOUT_MS]
    assert wait.describe() == "appendfsync always + WAIT 1"
    aof = Confirm(waitaof=True, replicas=2)
    assert aof.command() == ["WAITAOF", 1, 2, CONFIRM_TIMEOUT_MS]
    assert aof.describe() == "appendfsync always + WAITAOF 1 2"


def test_what_falls_short() -> None:
    wait = Confirm(replicas=2)
    assert wait._shortfall(2) == "" and wait._shortfall(3) == ""
    assert wait._shortfall(1) == "1 of 2 replicas (STATEWORKER_STRICT_REPLICAS)"
    aof = Confirm(waitaof=True, replicas=0)
    assert aof._shortfall([1, 0]) == ""
    assert "AOF" in aof._shortfall([0, 0])
    assert aof._shortfall(ReplyError("ERR unknown command")) == "ERR unknown command"
