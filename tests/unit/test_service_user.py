"""The service's ACL rule: docs/security.md's copy is the code's, the `acl-rule` command prints
it, and a NOPERM met during the start becomes its one line (the rule itself is served under in
tests/integration/service/test_service_user.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stateworker.app import cli, service_user
from stateworker.errors import ConfigError, MissingPermission
from stateworker.settings import Settings

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_docs_copy_of_the_rule_is_the_codes() -> None:
    lines = [line for line in SECURITY.read_text().splitlines()
             if line.startswith("ACL SETUSER stateworker on")]
    assert lines == [service_user.setuser_line(service_user.rule("sw"))]


def test_the_docs_name_what_strict_durability_and_a_database_add() -> None:
    base = set(service_user.rule("sw"))
    added = set(service_user.rule("sw", strict=True, waitaof=True, select=True)) - base
    assert added == {"+config|get", "+command|info", "+wait", "+waitaof", "+select"}
    text = SECURITY.read_text()
    assert all(f"`{permission}`" in text for permission in added)


def test_the_rule_names_commands_one_key_and_one_channel_pattern_no_category() -> None:
    rule = service_user.rule("p-1")
    assert rule[:6] == ["on", "resetkeys", "~p-1:*", "resetchannels", "&p-1:reply:*", "-@all"]
    assert all(re.fullmatch(r"\+[a-z]+(\|[a-z]+)?", arg) for arg in rule[6:])
    assert len(set(rule)) == len(rule)


def test_acl_rule_prints_the_rule_for_the_prefix(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEWORKER_PREFIX", "orders")
    monkeypatch.setenv("STATEWORKER_DURABILITY", "strict")
    assert cli.main(["--redis-url", "redis://h:6379/2", "acl-rule", "--user", "svc"]) == 0
    assert capsys.readouterr().out == service_user.setuser_line(
        service_user.rule("orders", strict=True, select=True), "svc") + "\n"


@pytest.mark.parametrize("url, selects", [
    (None, False), ("redis://h:6379", False), ("redis://h:6379/0", False),
    ("redis://h:6379/3", True), ("unix:///tmp/r.sock?db=1", True), ("unix:///tmp/r.sock", False),
    ("redis://u:p@h:7000,redis://u:p@h:7001", False), ("redis://h:7000/0,redis://h:7001/0", False),
    ("redis://h:7000,redis://h:7001/2", True),  # (a Redis Cluster's seeds)
])
def test_a_url_naming_a_database_needs_select(url: str | None, selects: bool) -> None:
    assert service_user.selects(url) is selects


def test_a_noperm_anywhere_in_a_failed_start_is_one_line() -> None:
    settings = Settings(redis_url="redis://svc:secret@h:6379/0", prefix="sw")
    inner = ConfigError("Redis at h is not usable: NOPERM this user has no permissions to run "
                        "the 'info' command")
    group = BaseExceptionGroup("start", [ValueError("other"), RuntimeError("wrapped")])
    group.exceptions[1].__cause__ = inner
    found = service_user.missing_from(group, settings, "redis://svc:***@h:6379/0")
    assert isinstance(found, MissingPermission)
    assert str(found) == (
        'the Redis user "svc" at redis://svc:***@h:6379/0 lacks part of the service\'s ACL '
        "rule: +info; the whole rule is in docs/security.md, or run `stateworker acl-rule`")
    keys = RuntimeError("NOPERM this user has no permissions to access one of the keys used "
                        "as arguments")
    found = service_user.missing_from(keys, settings, "u")
    assert found is not None and "~sw:* (a key of a start-up command)" in str(found)
    assert service_user.missing_from(ConfigError("AOF off"), settings, "u") is None
