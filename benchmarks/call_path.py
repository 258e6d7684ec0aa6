"""The way of one bus `state::set`, from the stream read to the reply: the package modules
whose functions run for it (`python -m benchmarks.call_path`; docs/architecture.md states
the list, tests/integration/bus/test_call_path.py keeps it true).

How it counts: a state service runs in this process; a raw client (redis-py, no module of
the package) XADDs one call and waits for its reply while `sys.setprofile` notes the module
of every package function called. Only calls made on the service's way count: those whose
outermost package frame is the runtime's read loop (`BusRuntime.run`: the read, the parse,
the plan, the send), a batch's task (`Serving._serve_batch`, bus/serving.py: the answer),
the reply writer's flusher, or the connection's protocol callbacks (the replies coming back);
the dispatcher, the reaper and the other followers of the same process do not count.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import msgspec
import redis.asyncio as aredis

from stateworker.app.service import StateService
from stateworker.bus.protocol import BusOptions
from stateworker.settings import Settings
from stateworker.transport.embedded import EmbeddedRedis

PACKAGE = "stateworker"
# The outermost package frames of the call's way (module, function).
ROOTS = {("stateworker.bus.runtime", "BusRuntime.run"),
         ("stateworker.bus.serving", "Serving._serve_batch"),
         ("stateworker.bus.reply_writer", "ReplyWriter.flusher"),
         ("stateworker.transport.wire", "RespProtocol.data_received"),
         ("stateworker.transport.wire", "RespProtocol.end_tick")}


def _root(frame: FrameType) -> tuple[str, str] | None:
    """The outermost package frame below `frame`: the task or callback it runs in."""
    root: FrameType | None = None
    at: FrameType | None = frame
    while at is not None:
        if at.f_globals.get("__name__", "").startswith(PACKAGE):
            root = at
        at = at.f_back
    return None if root is None else (root.f_globals["__name__"], root.f_code.co_qualname)


async def modules_on_the_way(redis_url: str, prefix: str = "callpath") -> list[str]:
    """The package modules one bus `state::set` runs functions of, sorted."""
    settings = Settings(redis_url=redis_url, prefix=prefix, partitions=4)
    raw = aredis.Redis.from_url(redis_url)
    reply = f"{prefix}:reply:path"
    try:
        async with StateService.running(settings, BusOptions(block_ms=50)) as service:

            async def call(n: int) -> None:
                await raw.xadd(service.runtime.bus.stream, {
                    "id": f"path-{n}", "fn": "state::set", "reply": reply,
                    "body": msgspec.json.encode({"scope": "s", "key": "k", "value": n})})
                assert await raw.blpop([reply], 10) is not None, "no reply within 10 s"

            for n in range(5):  # (first calls load scripts and warm caches: not the way)
                await call(n)
            seen: set[str] = set()

            def note(frame: FrameType, event: str, _arg: Any) -> None:
                module = frame.f_globals.get("__name__", "")
                if event == "call" and module.startswith(PACKAGE) and _root(frame) in ROOTS:
                    seen.add(module)

            sys.setprofile(note)
            try:  # (a few calls, their union: one may find a reply already read, or a read
                for n in range(5, 8):  # already under way, and skip a step the way has)
                    await call(n)
            finally:
                sys.setprofile(None)
    finally:
        await raw.aclose()
    return sorted(seen)


async def _main() -> None:
    with tempfile.TemporaryDirectory(prefix="sw-path-") as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        try:
            modules = await modules_on_the_way(server.url)
        finally:
            await server.stop()
    print(f"{len(modules)} modules on the way of one bus state::set:")
    for module in modules:
        print(f"  {module}")


if __name__ == "__main__":
    anyio.run(_main)
