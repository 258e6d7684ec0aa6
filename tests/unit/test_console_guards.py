"""The console's two judgements that need no browser: which binds are loopback-only (where
the console edits in `off` mode: app/hosts.py) and when a service looks stalled
(app/cli/status.py `stalled`: calls waiting and nobody reading, or waiting too long)."""

from __future__ import annotations

from typing import Any

import pytest

from stateworker.app.cli.status import STALL_MS, stalled
from stateworker.app.hosts import local_only
from stateworker.settings import Settings


@pytest.mark.parametrize(("bind", "local"), [
    ("127.0.0.1:8080", True), ("127.0.0.2:0", True), ("localhost:8080", True),
    ("[::1]:8080", True), ("0.0.0.0:8080", False), ("[::]:8080", False),
    ("10.0.0.5:8080", False), ("example.com:8080", False), (None, False)])
def test_loopback_binds(bind: str | None, local: bool) -> None:
    assert local_only(Settings(http=bind)) is local


@pytest.mark.parametrize(("hosts", "local"), [
    ("localhost, 127.0.0.1, [::1]", True), ("127.0.0.2", True), ("state.example.com", False),
    ("localhost, state.example.com", False), ("*", False)])
def test_a_loopback_bind_answering_to_other_names_is_not_local(hosts: str, local: bool) -> None:
    """Behind a reverse proxy on the same machine the names are the public ones."""
    assert local_only(Settings(http="127.0.0.1:8080", http_hosts=hosts)) is local


def service(consumers: list[dict[str, Any]], unread_ms: int | None = None,
            pending_ms: int | None = None) -> dict[str, Any]:
    return {"consumers": consumers, "oldest_unread_ms": unread_ms, "oldest_pending_ms": pending_ms}


def shard(lag: int | None, length: int, read: bool = True) -> dict[str, Any]:
    return {"lag": lag, "stream_length": length, "read": read}


def test_an_idle_service_with_nothing_waiting_is_not_stalled() -> None:
    old = {"name": "c1", "idle": 3_600_000}
    assert stalled(service([old]), [shard(0, 50)]) is None
    assert stalled(service([]), [shard(0, 50)]) is None  # (read, acknowledged, gone)


def test_calls_nobody_reads_are_stalled() -> None:
    assert stalled(service([], unread_ms=10), [shard(None, 3, read=False)]) == \
        "3 call(s) wait and no consumer reads this stream"


def test_a_call_waiting_past_the_threshold_is_stalled() -> None:
    dead = {"name": "c1", "idle": 900_000}
    assert stalled(service([dead], unread_ms=STALL_MS - 1), [shard(10, 10)]) is None
    assert stalled(service([dead], unread_ms=900_000), [shard(10, 10)]) == \
        "a call unread for 900 s; its consumers idle 900 s"
    assert stalled(service([dead], pending_ms=STALL_MS + 1000), [shard(0, 10)]) == \
        "a call read and not acknowledged for 61 s; its consumers idle 900 s"
