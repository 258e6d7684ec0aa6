"""What each script replies, read into a typed tuple (its binding's `reply`): one class per
script, fields named as the script's header names them. `read` gets the reply already checked
(statuses.script_reply); for an entry script, after a recorded reply was replayed and the
error statuses raised (RedisState.entry_plan).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from stateworker.errors import InternalError
from stateworker.scripts.statuses import LUA_STATUS


class SetReply(NamedTuple):
    """set.lua. OK: the value replaced and the new version. CONFLICT, UNCHANGED, NEEDS_HASH:
    the current value and version (0 = absent)."""

    status: int
    value: bytes | None
    version: int
    created: bool = False
    revision: bytes | None = None

    @classmethod
    def read(cls, reply: list[Any]) -> SetReply:
        if reply[0] == LUA_STATUS["OK"]:
            return cls(reply[0], reply[1], reply[2], reply[3] == 1, reply[4])
        return cls(reply[0], reply[2], reply[1])


class UpdateReply(NamedTuple):
    """update.lua's OK reply; `positions`: op errors name ops by position (this version's
    form) rather than by index (a record written by an older version)."""

    old_value: bytes | None
    new_value: bytes
    version: int
    created: bool
    written: bool
    op_errors: list[Any]
    positions: bool

    @classmethod
    def read(cls, reply: list[Any]) -> UpdateReply:
        _, old, new, version, created, written, errors, *marker = reply
        return cls(old, new, version, created == 1, written == 1, errors, bool(marker))


class DeleteReply(NamedTuple):
    old_value: bytes | None

    @classmethod
    def read(cls, reply: list[Any]) -> DeleteReply:
        return cls(reply[1])


class TopicReply(NamedTuple):
    found: bool

    @classmethod
    def read(cls, reply: list[Any]) -> TopicReply:
        return cls(bool(reply[1]))


class ReapReply(NamedTuple):
    deleted: int
    more: bool

    @classmethod
    def read(cls, reply: list[Any]) -> ReapReply:
        return cls(int(reply[1]), reply[2] == 1)


class DeltopicReply(NamedTuple):
    deleted: int
    cursor: bytes | None  # the last member examined; None when the range is done

    @classmethod
    def read(cls, reply: list[Any]) -> DeltopicReply:
        return cls(int(reply[1]), reply[2])


class AccessReply(NamedTuple):
    """access.lua. OK: whether the name existed. CONFLICT: `reason` ("exists", "no-role",
    "in-use") and the name it concerns."""

    existed: bool
    reason: str | None = None
    about: str | None = None

    @classmethod
    def read(cls, reply: list[Any]) -> AccessReply:
        if reply[0] == LUA_STATUS["OK"]:
            return cls(reply[1] == 1)
        return cls(False, reply[1].decode(), reply[2].decode())


class ClaimReply(NamedTuple):
    """claim.lua's OK reply: whether a scope was new, every scope the prefix owns, and the
    new scopes that were in use (adopted)."""

    claimed: bool
    owned: list[str]
    adopted: list[str]

    @classmethod
    def read(cls, reply: list[Any]) -> ClaimReply:
        return cls(reply[1] == 1, [scope.decode() for scope in reply[2]],
                   [scope.decode() for scope in reply[3]])


class ReleaseReply(NamedTuple):
    """release.lua's OK reply: each released scope with the namespace that owned it, and
    every scope the releasing caller owns now."""

    released: dict[str, str]
    owned: list[str]

    @classmethod
    def read(cls, reply: list[Any]) -> ReleaseReply:
        flat = [item.decode() for item in reply[1]]
        return cls(dict(zip(flat[::2], flat[1::2], strict=True)),
                   [scope.decode() for scope in reply[2]])


class EntriesReply(NamedTuple):
    last_member: bytes | None
    last_score: bytes | None
    skip_left: int
    fields: list[Any]  # 9 per entry (entries.lua)

    @classmethod
    def read(cls, reply: list[Any]) -> EntriesReply:
        return cls(reply[1], reply[2], int(reply[3]), reply[4])


class BarrierReply(NamedTuple):
    """barrier.lua's OK reply: outcome (allow, waiting, counted, unknown, complete, expect),
    keys arrived and expected, the payload (allow), the first missing keys (named sets)."""

    outcome: str
    arrived: int
    expected: int
    payload: bytes | None
    missing: list[bytes]

    @classmethod
    def read(cls, reply: list[Any]) -> BarrierReply:
        return cls(reply[1].decode(), int(reply[2]), int(reply[3]), reply[4], reply[5])


class Moved(NamedTuple):
    """advance.lua, lease.lua, sethash.lua: whether the script wrote (the position moved, the
    lease was taken / renewed / dropped, the hash stored); 0: nothing written."""

    done: bool

    @classmethod
    def read(cls, reply: list[Any]) -> Moved:
        return cls(reply[1] == 1)


class Swept(NamedTuple):
    """sweep.lua: the dead consumers removed, and the consumers the group still holds."""

    removed: int
    left: int

    @classmethod
    def read(cls, reply: list[Any]) -> Swept:
        return cls(int(reply[1]), int(reply[2]))


class Marked(NamedTuple):
    """aside.lua: whether the mark was written (set, moved, dropped); False: the lease is
    another's. Arguments that are not a mark (-1) are a bug of the caller: raised."""

    done: bool

    @classmethod
    def read(cls, reply: list[Any]) -> Marked:
        if reply[1] == -1:
            raise InternalError("aside.lua: the arguments are not a trigger's mark")
        return cls(reply[1] == 1)


class Counted(NamedTuple):
    """forget.lua: how many it forgot; repack.lua: how many names it changed; snapread.lua:
    the read's count, or minus the counter when it is behind."""

    number: int

    @classmethod
    def read(cls, reply: list[Any]) -> Counted:
        return cls(int(reply[1]))


class SnapRowsReply(NamedTuple):
    """snaprows.lua: the batch's last event id (None: no event after the position) and its
    count, whether events follow it (`more`), whether every event after it was examined, and
    the entries read (scope, key, the revision of its last change, stored or None)."""

    last: str | None
    events: int
    more: bool
    complete: bool
    rows: list[tuple[str, str, bytes, bytes | None]]

    @classmethod
    def read(cls, reply: list[Any]) -> SnapRowsReply:
        flat = reply[5]
        rows = [(flat[i].decode(), flat[i + 1].decode(), flat[i + 2], flat[i + 3] or None)
                for i in range(0, len(flat), 4)]
        return cls(reply[1].decode() if reply[1] else None, int(reply[2]), reply[3] == 1,
                   reply[4] == 1, rows)


class Page(NamedTuple):
    """snappage.lua: a stream's entries ({id, [field, value, ...]}) and whether the page ended
    at its bounds (`more`: entries may follow) rather than at the stream's end."""

    more: bool
    entries: list[Any]

    @classmethod
    def read(cls, reply: list[Any]) -> Page:
        return cls(reply[1] == 1, reply[2])


class TriggerReply(NamedTuple):
    """trigger.lua. OK: whether the id was registered before. CONFLICT: refused,
    `registered` registrations already (and, refused for their bytes: `bytes`, what they would
    hold with this one, and `limit`); refused past an owner's share: `share_of` names the
    owner, `over` which of its limits ("count" or "bytes", `limit`), `registered` and `bytes`
    are its. FORBIDDEN: the id is `owner`'s trigger."""

    refused: bool
    existed: bool
    registered: int
    owner: str | None = None  # set: refused, another owner's trigger ("": an ownerless one)
    bytes: int | None = None  # set: refused for the registrations' bytes in all
    limit: int = 0
    share_of: str | None = None  # set: refused past this owner's share
    over: str = ""  # ... of its registrations ("count") or of their bytes ("bytes")

    @classmethod
    def read(cls, reply: list[Any]) -> TriggerReply:
        if reply[0] == LUA_STATUS["OK"]:
            return cls(False, reply[1] == 1, 0)
        if reply[0] == LUA_STATUS["FORBIDDEN"]:
            return cls(True, True, 0, reply[1].decode())
        if len(reply) > 4:
            return cls(True, False, int(reply[1]), None, int(reply[2]), int(reply[3]),
                       reply[4].decode(), reply[5].decode())
        if len(reply) > 2:
            return cls(True, False, int(reply[1]), None, int(reply[2]), int(reply[3]))
        return cls(True, False, int(reply[1]))


class KeptReply(NamedTuple):
    """keeptrigger.lua. "keep": `done` 1 renewed, 0 not registered or expired; `changed`: its
    registration changed since it was read (nothing written). "reap": `done` removed,
    `more` expired ones remain."""

    changed: bool
    done: int
    more: bool

    @classmethod
    def read(cls, reply: list[Any]) -> KeptReply:
        if reply[0] == LUA_STATUS["CONFLICT"]:
            return cls(True, 0, False)
        return cls(False, int(reply[1]), len(reply) > 2 and reply[2] == 1)


class ListReply(NamedTuple):
    """list.lua: one chunk of the live keys or values, in key byte order, and the last key it
    read (None: the scope's index holds no more)."""

    items: list[bytes]
    last: bytes | None

    @classmethod
    def read(cls, reply: list[Any]) -> ListReply:
        return cls(list(reply[1]), reply[3] if reply[2] == 1 else None)


class GetManyReply(NamedTuple):
    """getmany.lua: 9 fields per key asked (value None: missing or expired); or, when the
    values pass the call's byte limit, `over`: (the key's index, bytes by then, the limit)."""

    entries: list[list[Any]]
    over: tuple[int, int, int] | None = None

    @classmethod
    def read(cls, reply: list[Any]) -> GetManyReply:
        if reply[0] == LUA_STATUS["CALL_TOO_LARGE"]:  # {status, index, bytes, limit}
            return cls([], (int(reply[1]), int(reply[2]), int(reply[3])))
        return cls(list(reply[1]))


class DelprefixReply(NamedTuple):
    """delprefix.lua: entries deleted, and whether keys with the prefix remain."""

    deleted: int
    more: bool

    @classmethod
    def read(cls, reply: list[Any]) -> DelprefixReply:
        return cls(int(reply[1]), reply[2] == 1)


class IndexReply(NamedTuple):
    """index.lua: create 1 defined / 0 already / -1 at the limit; build 1 ready / 0 more /
    2 dropped; drop 1 dropped / 0 none."""

    outcome: int

    @classmethod
    def read(cls, reply: list[Any]) -> IndexReply:
        return cls(int(reply[1]))


class PageReply(NamedTuple):
    """pages.lua's OK reply: where the page begins, the snapshot's size, the page's rows (each
    `["<key>",<value>]` as the page writes it) and whether it is the last."""

    offset: int
    total: int
    rows: list[bytes]
    done: bool

    @classmethod
    def read(cls, reply: list[Any]) -> PageReply:
        return cls(reply[1], reply[2], list(reply[3]), reply[4] == 1)


class ConfigReply(NamedTuple):
    """config.lua: every live setting's override stored, name -> value text."""

    overrides: dict[str, str]

    @classmethod
    def read(cls, reply: list[Any]) -> ConfigReply:
        flat = [item.decode(errors="replace") for item in reply[1]]
        return cls(dict(zip(flat[::2], flat[1::2], strict=True)))
