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
