"""Structured logs: one JSON line per event of note (start, stop, reclaim, call errors ...),
and `repeats`: a failure that recurs with every call or round (Redis full, away) said once
every REPEAT_S, not once a call."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

REPEAT_S = 10.0  # a recurring failure's line: at most once this often per event and kind

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return msgspec.json.encode(line, enc_hook=str).decode()


def configure(level: str = "INFO") -> None:
    """JSON lines on stderr for the `stateworker` loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("stateworker")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


class Repeats:
    """Log lines said at most once every `every_s` per event name (its `extra["event"]`) and
    kind of failure (`failure_kind` of the first exception among the line's arguments): a
    Redis at its maxmemory refuses every call and every round of the upkeep, and a line each
    (measured: 450 in 10 s of a small test) floods the log and its disk, and hides the other
    lines. The lines held back are counted, and the next line of the event and kind says how
    many (`held_back`). Per kind, as one event names failures of many causes (a reply write
    refused for a caller's key of another type, or for Redis full; a dispatch paused for Redis
    away, or for a lost prefix): the first line of a new cause is said at once, not held
    behind another's for `every_s`."""

    def __init__(self, every_s: float = REPEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._said: dict[str, tuple[float, int]] = {}  # event -> (when said, held back since)

    def clear(self) -> None:
        """Forget what was said: the next line of every event is said."""
        self._said.clear()

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object,
            extra: dict[str, Any]) -> bool:
        """`logger.log(level, msg, *args, extra=extra)` unless the event was said less than
        `every_s` ago (then counted); whether it was said."""
        failure = next((arg for arg in args if isinstance(arg, BaseException)), None)
        kind = failure_kind(failure)
        event, now = f"{extra['event']}|{kind}", self.clock()
        said, held = self._said.get(event, (-self.every_s, 0))
        if now - said < self.every_s:
            self._said[event] = (said, held + 1)
            return False
        if len(self._said) >= 1024:  # (event names and kinds are few, but keep it bounded)
            self.clear()
        self._said[event] = (now, 0)
        if held:
            msg += f" ({held} more like it held back in the last {now - said:.0f} s)"
        logger.log(level, msg, *args, extra={**extra, "held_back": held, "kind": kind})
        return True


def failure_kind(failure: BaseException | None) -> str:
    """What kind of failure `failure` is, as Repeats tells them apart: a StateError's code
    (UNAVAILABLE, STORE_LOST ...), a Redis error reply's own code (OOM, WRONGTYPE, NOPERM:
    its first word, in capitals) with its class, else its class. Not its whole text, which
    names keys and ids: every call's line would be a kind of its own."""
    if failure is None:
        return ""
    code = getattr(failure, "code", None)
    if isinstance(code, str):
        return code
    word = str(failure).split(" ", 1)[0]
    named = word.isupper() and word.replace("_", "").isalpha() and len(word) <= 32
    return f"{type(failure).__name__}:{word}" if named else type(failure).__name__


repeats = Repeats()
