"""Several MULTI ... EXEC transactions on a Redis Cluster, each kept to one slot: Redis refuses
a transaction (or an XREAD) across slots, even on one node. Those whose slots one primary
serves go back to back in one pipeline, the primaries' pipelines side by side, so the whole
set costs one round trip. Grouped here by the map as it stands; ClusterConnection routes each
MULTI with the commands after it and each EXEC with those before it, so a transaction stays
whole on one node even when the map changes between the grouping and the sending."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from stateworker.transport.cluster import ClusterConnection
from stateworker.transport.slots import key_slot
from stateworker.transport.wire import Arg, ConnectionLost, ReplyError


async def transactions_by_slot(conn: ClusterConnection, each: Sequence[Sequence[Sequence[Arg]]],
                               keys: Sequence[str]) -> list[list[Any]]:
    """The replies of each command list (all of the slot of its key in `keys`) run as a MULTI
    ... EXEC of its own. Raises the first ConnectionLost or error reply met (an EXECABORT: a
    command met MOVED or ASK; the map is read again before the next command)."""
    replies: list[list[Any]] = [[] for _ in each]
    failed: list[ConnectionLost | ReplyError] = []  # (raised as itself, not in a group)

    async def node(indexes: list[int], scope: anyio.CancelScope) -> None:
        commands: list[Sequence[Arg]] = []
        for i in indexes:
            commands += [["MULTI"], *each[i], ["EXEC"]]
        try:
            got = await conn.pipeline(commands)
            for reply in got:
                if isinstance(reply, ReplyError):
                    raise reply
        except (ConnectionLost, ReplyError) as exc:
            failed.append(exc)
            scope.cancel()
            return
        end = 0
        for i in indexes:
            end += len(each[i]) + 2
            replies[i] = list(got[end - 1])

    async with anyio.create_task_group() as tg:
        for indexes in _by_primary(conn, keys):
            tg.start_soon(node, indexes, tg.cancel_scope)
    if failed:
        raise failed[0]
    return replies


def _by_primary(conn: ClusterConnection, keys: Sequence[str]) -> list[list[int]]:
    """The keys' indexes grouped by the primary serving their slot; a slot without a known
    owner alone."""
    groups: dict[str, list[int]] = {}
    alone: list[list[int]] = []
    for i, key in enumerate(keys):
        owner = conn.owner_url(key_slot(key))
        if owner is None:
            alone.append([i])
        else:
            groups.setdefault(owner, []).append(i)
    return [*groups.values(), *alone]
