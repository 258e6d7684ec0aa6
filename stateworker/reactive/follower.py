"""The loop of a follower of the event streams (the trigger dispatcher, the snapshotter): one
step at a time until it is cancelled; a step that fails is handed to the follower's own
`failed` (which says what it was and what to start again from), then the next step waits out
a backoff. Cancellation is no failure: it ends the loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio

from stateworker.transport.retry import Backoff


async def follow(step: Callable[[], Awaitable[None]],
                 failed: Callable[[Exception], Awaitable[None]], backoff: Backoff) -> NoReturn:
    """Run `step` again and again; after a failure, `failed(exc)`, then a pause."""
    while True:
        try:
            await step()
            backoff.reset()
        except Exception as exc:  # (a bug too: the service goes on; the step is retried)
            await failed(exc)
            await anyio.sleep(backoff.next())
