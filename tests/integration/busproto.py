"""Speaking the bus protocol by hand (XADD a call, BLPOP its reply), as programs in other
languages do."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import redis.asyncio as aredis


async def send(raw: aredis.Redis, prefix: str, fn: str, body: Any, *, reply: str | None = None,
               call_id: str | None = None, **extra: Any) -> tuple[str, str]:
    call_id = call_id or uuid.uuid4().hex
    reply = reply or f"{prefix}:reply:{uuid.uuid4().hex}"
    data = body if isinstance(body, bytes | str) else msgspec.json.encode(body)
    fields = {"id": call_id, "fn": fn, "body": data, "reply": reply, **extra}
    await raw.xadd(f"{prefix}:bus:state", fields)
    return call_id, reply


async def receive(raw: aredis.Redis, reply: str, timeout: float = 10) -> dict[str, Any]:
    popped = await raw.blpop([reply], timeout=timeout)
    assert popped is not None, f"no reply on {reply} within {timeout}s"
    result: dict[str, Any] = msgspec.json.decode(popped[1])
    return result


async def roundtrip(raw: aredis.Redis, prefix: str, fn: str, body: Any, **extra: Any
                    ) -> dict[str, Any]:
    call_id, reply = await send(raw, prefix, fn, body, **extra)
    document = await receive(raw, reply)
    assert document["id"] == call_id
    return document


async def until(condition: Callable[[], Awaitable[bool] | bool], timeout: float,
                what: str) -> None:
    """Poll `condition()` (a coroutine function or a plain one) until it holds."""
    async def holds() -> bool:
        result = condition()
        return bool(await result) if inspect.isawaitable(result) else result

    try:
        with anyio.fail_after(timeout):
            while not await holds():
                await anyio.sleep(0.005)  # polling a condition in Redis
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None
