"""A client's call ids (docs/bus-protocol.md, "The identity of a call": ids with a home):
`<16 hex>-<n>`, new per call, and which partition a call's body names (`body_partition`: its
`scope`'s).

On a Redis Cluster the service binds an id in its home partition's records
(`KeySpace.id_home`: a function of the id's SHA-1 alone, so an id reused for a call in any
partition meets its binding). A call whose id's home is its scope's partition costs the
service one script, whose record binds the id in the same slot; any other id costs a step
more (bind.lua on the home's node, then the script). So a client on a cluster gives each call
that names a scope an id whose home is the scope's partition (`CallIds.new`): it draws ids in
order and keeps the ones whose home is elsewhere for later calls there, a few per partition,
so a client spread over the partitions pays about one SHA-1 per call, and one that keeps to
one partition at most `SEARCH_LIMIT`. On one Redis any id is bound in one script: ids are
drawn in order, no SHA-1.
"""

from __future__ import annotations

import itertools
import uuid

import msgspec

from stateworker.keys import KeySpace, call_field
from stateworker.transport.wire import Arg

SEARCH_LIMIT = 256  # ids drawn for one call at most (then it takes the last: a step more)
SPARE_PER_PARTITION = 32  # ids kept for later calls in another partition


class _Scoped(msgspec.Struct):
    scope: str | None = None  # (a body's other fields are skipped, not kept)


_scope_decoder = msgspec.json.Decoder(_Scoped)


def body_partition(keys: KeySpace, body: Arg) -> int | None:
    """The partition of the `scope` a call's body names (a JSON object with a text `scope`);
    None for any other body."""
    if not isinstance(body, bytes | str):
        return None
    try:
        scope = _scope_decoder.decode(body).scope
        return None if scope is None else keys.partition_of(scope)
    except (msgspec.DecodeError, UnicodeEncodeError):  # (a lone surrogate: refused anyway)
        return None


class CallIds:
    """New call ids for one client. `keys`: the cluster's key space (None on one Redis: ids in
    order); `principal`: `acl` mode's, whose name the service puts before each id."""

    def __init__(self, keys: KeySpace | None = None, principal: str | None = None) -> None:
        self.keys = keys
        self._prefix = uuid.uuid4().hex[:16]
        self._count = itertools.count()
        self._owner = "" if principal is None else f"{principal}/"  # (bus/entries.parse_entry)
        self._spare: dict[int, list[str]] = {}

    def new(self, partition: int | None = None) -> str:
        """A new id; on a cluster with `partition` given, one whose home is that partition
        (unless none was found within SEARCH_LIMIT draws)."""
        keys = self.keys
        if keys is None or partition is None:
            return f"{self._prefix}-{next(self._count)}"
        spare = self._spare.get(partition)
        if spare:
            return spare.pop()
        for _ in range(SEARCH_LIMIT - 1):
            call_id = f"{self._prefix}-{next(self._count)}"
            home = keys.id_home(call_field(self._owner + call_id))
            if home == partition:
                return call_id
            kept = self._spare.setdefault(home, [])
            if len(kept) < SPARE_PER_PARTITION:
                kept.append(call_id)
        return f"{self._prefix}-{next(self._count)}"  # (none at home: one kept by no one)
