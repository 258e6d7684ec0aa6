"""What every `stateworker` command shares: settings from the arguments, argument types,
errors on stderr and the exit statuses (`--output json|table`: app/output.py)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

import msgspec

from stateworker.bus.resends import MAX_TIMEOUT_S
from stateworker.codec import whole_number
from stateworker.errors import StateError, shown
from stateworker.keys import MAX_SERVICE_BYTES, bus_name_problem
from stateworker.settings import Settings

# The exit statuses every command shares; each epilog says what 1 means for its command.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
USAGE_LINE = "  2  bad usage or configuration (arguments, --redis-url, STATEWORKER_* variables)"

RAW = argparse.RawDescriptionHelpFormatter


def settings_of(args: argparse.Namespace) -> Settings:
    return Settings.from_env(redis_url=args.redis_url)


def print_error(exc: StateError) -> int:
    """An error as `{code, message, details}` on stderr (one JSON line); exit status 1."""
    print(msgspec.json.encode(exc.to_dict()).decode(), file=sys.stderr)
    return EXIT_FAILED


def print_json(value: Any) -> None:
    print(msgspec.json.encode(value).decode(), flush=True)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, at most "
                                         f"{MAX_TIMEOUT_S} s (a year), got {shown(text)}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {shown(text)}")
    return value


# --ttl's units, in milliseconds; a bare number is seconds, as --timeout's
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)?")


def duration_ms(text: str) -> int:
    """A duration (`30s`, `5m`, `2h`, `1d`, `250ms`, `1.5s`; a bare number is seconds) in
    whole milliseconds, at least 1."""
    match = _DURATION.fullmatch(text.strip())
    ms = round(float(match[1]) * _UNITS[match[2] or "s"]) if match else 0
    if ms < 1:
        raise argparse.ArgumentTypeError(f"must be a duration such as 30s, 5m, 2h, 1d or 250ms "
                                         f"(a bare number is seconds), got {shown(text)}")
    return ms


def version_number(text: str) -> int:
    """An entry's version: 0 (the key absent) or more."""
    version = whole_number(text)
    if version is None:
        raise argparse.ArgumentTypeError(f"must be a version, a whole number of 0 or more "
                                         f"(0: the key must be absent), got {shown(text)}")
    return version


def json_object(text: str) -> dict[str, Any]:
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {shown(text)}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {shown(text)}")
    return value


def service_name(text: str) -> str:
    """A service's name, by the bus's rules (keys.bus_name_problem, at most MAX_SERVICE_BYTES)."""
    problem = "is empty" if not text else bus_name_problem(text)
    if problem is None and len(text.encode()) > MAX_SERVICE_BYTES:
        problem = f"is {len(text.encode())} bytes, more than the limit of {MAX_SERVICE_BYTES}"
    if problem is not None:
        raise argparse.ArgumentTypeError(f"a service name {problem}, got {shown(text)}")
    return text
