"""logs.Repeats: a recurring failure's line said once every `every_s` per event, the lines
held back counted into the next one (a clock of the test's own)."""

from __future__ import annotations

import logging

import pytest

from stateworker.logs import Repeats


def test_a_recurring_line_is_said_once_a_window_with_what_was_held_back(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    repeats = Repeats(10.0, clock=lambda: now[0])
    log = logging.getLogger("stateworker.test.repeats")
    caplog.set_level(logging.WARNING, "stateworker.test.repeats")
    said = [repeats.log(log, logging.WARNING, "full: %s", n, extra={"event": "full", "n": n})
            for n in range(500)]
    assert said == [True] + [False] * 499
    assert repeats.log(log, logging.WARNING, "away", extra={"event": "away"})  # (its own)
    now[0] += 9.9
    assert not repeats.log(log, logging.WARNING, "full: %s", 500, extra={"event": "full"})
    now[0] += 0.1
    assert repeats.log(log, logging.WARNING, "full: %s", 501, extra={"event": "full"})
    lines = [(r.getMessage(), r.held_back) for r in caplog.records]
    assert lines == [("full: 0", 0), ("away", 0),
                     ("full: 501 (500 more like it held back in the last 10 s)", 500)]
    repeats.clear()
    assert repeats.log(log, logging.WARNING, "full: %s", 502, extra={"event": "full"})


class ReplyError(Exception):
    """(As Redis's error replies read: their code first.)"""


def test_a_new_kind_of_failure_of_the_same_event_is_said_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """One event names failures of many causes: a reply write refused as Redis is full, then
    refused as a caller's reply key holds another type. The first line of the new cause is
    said at once, not held behind the other's for 10 s (never said, when it does not recur);
    the same cause with another key, or another call, is the same kind."""
    now = [100.0]
    repeats = Repeats(10.0, clock=lambda: now[0])
    log = logging.getLogger("stateworker.test.repeats")
    caplog.set_level(logging.WARNING, "stateworker.test.repeats")
    extra = {"event": "bus.write_failed"}
    full = [ReplyError(f"OOM command not allowed when used memory > 'maxmemory' ({n})")
            for n in range(3)]
    said = [repeats.log(log, logging.WARNING, "reply write failed: %s", e, extra=extra)
            for e in full]
    wrong = ReplyError("WRONGTYPE Operation against a key holding the wrong kind of value")
    said.append(repeats.log(log, logging.WARNING, "reply write failed: %s", wrong, extra=extra))
    said.append(repeats.log(log, logging.WARNING, "reply write failed: %s", wrong, extra=extra))
    away = ConnectionError("connection to 127.0.0.1:6379 lost")
    said.append(repeats.log(log, logging.WARNING, "reply write failed: %s", away, extra=extra))
    assert said == [True, False, False, True, False, True]
    assert [r.getMessage().split(": ", 1)[1][:9] for r in caplog.records] == \
        ["OOM comma", "WRONGTYPE", "connectio"]
