"""Which Redis Cluster slot a command goes to: the keys of each command, and their slot.

A key's slot is CRC16 (XMODEM; `binascii.crc_hqx(key, 0)`, in C) of the key, or of its hash
tag (the part between the first `{` and the first `}` after it, when not empty), mod 16384, as
Redis computes it. The keys of a command are found by one table (`KEYS_OF`): most commands
have their key at argument 1; the others say where theirs are. A command without keys (PING,
INFO, TIME ...) has no slot (`None`: any primary serves it); a few must run on every primary
(`BROADCAST`: the function library, FUNCTION LOAD / FLUSH ...), and an ACL change on every
node, replicas included (`ACL_ON_EVERY_NODE`: Redis keeps users per node).

A command whose keys hash to two slots could never run on a cluster (Redis answers CROSSSLOT):
in this project that is a bug (every script keeps to one partition, one hash tag), so
`slot_of` raises `CrossSlot` at once instead of sending it.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence

from stateworker.errors import shown
from stateworker.transport.wire import Arg

SLOTS = 16384

# Commands that run on every primary (the script library is one per node; a replica promoted
# or a new node must have it too).
BROADCAST = frozenset({"FUNCTION", "SCRIPT", "FLUSHALL", "FLUSHDB"})
# ACL subcommands that change a node's users: Redis keeps users per node and does not
# replicate them, so they run on every node, replicas too (one may be promoted).
ACL_ON_EVERY_NODE = frozenset({"SETUSER", "DELUSER", "SAVE", "LOAD"})

# Commands without keys: any primary serves them.
KEYLESS = frozenset({
    "PING", "INFO", "TIME", "CLIENT", "CONFIG", "COMMAND", "ECHO", "DBSIZE", "CLUSTER", "WAIT",
    "WAITAOF", "ACL", "AUTH", "HELLO", "SELECT", "MULTI", "EXEC", "DISCARD", "ASKING", "LASTSAVE",
    "BGREWRITEAOF", "SAVE", "LATENCY", "SLOWLOG", "ROLE", "READONLY", "READWRITE",
    "RANDOMKEY", "SWAPDB", "SHUTDOWN", "DEBUG", "MONITOR", "SUBSCRIBE", "PUBLISH", "QUIT",
    "RESET", "FAILOVER", "REPLICAOF", "SLAVEOF", "LOLWUT",
})


class CrossSlot(ValueError):
    """A command whose keys hash to different cluster slots (a bug in the caller)."""


_TAG_SLOTS: dict[bytes, int] = {}  # hash tag -> slot: the partitions' few tags, hashed once
_STR_TAG_SLOTS: dict[str, int] = {}  # the same for the tags of names given as text
_TAG_SLOTS_MAX = 4096  # (tags that are call ids come and go: the cache starts over past this)


def key_slot(key: Arg) -> int:
    """The cluster slot of `key`, with Redis's hash tag rule."""
    # (Most keys: their tag found without encoding the name; '{' and '}' are one byte each in
    # UTF-8, so the tag is the same.)
    text_tag = _text_tag(key)
    if text_tag is not None:
        slot = _STR_TAG_SLOTS.get(text_tag)
        if slot is None:
            if len(_STR_TAG_SLOTS) >= _TAG_SLOTS_MAX:
                _STR_TAG_SLOTS.clear()
            slot = _STR_TAG_SLOTS[text_tag] = binascii.crc_hqx(text_tag.encode(), 0) % SLOTS
        return slot
    raw = key if isinstance(key, bytes) else str(key).encode()
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            tag = raw[start + 1:end]
            slot = _TAG_SLOTS.get(tag)
            if slot is None:
                if len(_TAG_SLOTS) >= _TAG_SLOTS_MAX:
                    _TAG_SLOTS.clear()
                slot = _TAG_SLOTS[tag] = binascii.crc_hqx(tag, 0) % SLOTS
            return slot
    return binascii.crc_hqx(raw, 0) % SLOTS


def name_slot(name: Arg) -> int:
    """`key_slot` of a name that comes again and again (a reply list, a call stream, a
    partition's tag), looked up whole: one dict lookup where key_slot finds the tag first."""
    slot = _NAME_SLOTS.get(name)
    if slot is None:
        if len(_NAME_SLOTS) >= _TAG_SLOTS_MAX:
            _NAME_SLOTS.clear()
        slot = _NAME_SLOTS[name] = key_slot(name)
    return slot


_NAME_SLOTS: dict[Arg, int] = {}


def _tag_at(key: Arg) -> tuple[int, int] | None:
    """Where the hash tag of a name given as text is: its "{" and "}" (None: bytes, no tag)."""
    if not isinstance(key, str):
        return None
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return (start, end) if end > start + 1 else None


def _text_tag(key: Arg) -> str | None:
    """The hash tag of a name given as text (None: bytes, or no tag)."""
    at = _tag_at(key)
    return None if at is None else str(key)[at[0] + 1:at[1]]


def _through_tag(key: Arg) -> str | None:
    """A text name up to and with its hash tag's "}" (None: bytes, or no tag)."""
    at = _tag_at(key)
    return None if at is None else str(key)[:at[1] + 1]


def _word(arg: Arg) -> str:
    if isinstance(arg, str):
        word = _WORDS.get(arg)
        if word is None:
            if len(_WORDS) >= _TAG_SLOTS_MAX:
                _WORDS.clear()
            word = _WORDS[arg] = arg.upper()
        return word
    return (arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)).upper()


_WORDS: dict[str, str] = {}  # a command's name as given -> upper case (a few, looked up per command)


def _numkeys(at: int) -> Callable[[Sequence[Arg]], Sequence[Arg]]:
    """The keys after a count at argument `at` (FCALL name numkeys key ...)."""
    def keys(args: Sequence[Arg]) -> Sequence[Arg]:
        count = int(args[at])
        return args[at + 1:at + 1 + count]
    return keys


def _after_streams(args: Sequence[Arg]) -> Sequence[Arg]:
    """XREAD / XREADGROUP ... STREAMS key ... id ...: the first half after STREAMS."""
    for i, arg in enumerate(args):
        if _word(arg) == "STREAMS":
            rest = args[i + 1:]
            return rest[:len(rest) // 2]
    return ()


def _scan_match(args: Sequence[Arg]) -> Sequence[Arg]:
    """SCAN cursor MATCH pattern ...: a pattern with a hash tag keeps to that tag's node (the
    project scans one partition at a time); without one SCAN goes to any primary, which on a
    cluster sees only its own keys."""
    for i in range(2, len(args) - 1):
        if _word(args[i]) == "MATCH":
            pattern = args[i + 1]
            raw = pattern if isinstance(pattern, bytes) else str(pattern).encode()
            start = raw.find(b"{")
            end = raw.find(b"}", start + 1)
            if start >= 0 and end > start + 1 and not any(c in raw[start:end] for c in b"*?[\\"):
                return (raw[start:end + 1],)
    return ()


def _first(args: Sequence[Arg]) -> Sequence[Arg]:
    return args[1:2]


def _second(args: Sequence[Arg]) -> Sequence[Arg]:
    return args[2:3]


def _all(args: Sequence[Arg]) -> Sequence[Arg]:
    return args[1:]


def _all_but_last(args: Sequence[Arg]) -> Sequence[Arg]:
    return args[1:-1]


# Where a command's keys are, when not argument 1 alone (the default, `_first`).
KEYS_OF: dict[str, Callable[[Sequence[Arg]], Sequence[Arg]]] = {
    "FCALL": _numkeys(2), "FCALL_RO": _numkeys(2),  # FCALL function numkeys key ... arg ...
    "EVAL": _numkeys(2), "EVALSHA": _numkeys(2), "EVAL_RO": _numkeys(2), "EVALSHA_RO": _numkeys(2),
    "XREAD": _after_streams, "XREADGROUP": _after_streams,
    "XINFO": _second, "XGROUP": _second, "OBJECT": _second,  # XGROUP CREATE key ...
    "BLMPOP": _numkeys(2), "BZMPOP": _numkeys(2),  # BLMPOP timeout numkeys key ...
    "LMPOP": _numkeys(1), "ZMPOP": _numkeys(1), "SINTERCARD": _numkeys(1),
    "ZUNION": _numkeys(1), "ZINTER": _numkeys(1), "ZDIFF": _numkeys(1),
    "DEL": _all, "UNLINK": _all, "EXISTS": _all, "MGET": _all, "TOUCH": _all, "WATCH": _all,
    "SINTER": _all, "SUNION": _all, "SDIFF": _all,
    "MSET": lambda args: args[1::2], "MSETNX": lambda args: args[1::2],
    "BLPOP": _all_but_last, "BRPOP": _all_but_last, "BZPOPMIN": _all_but_last,
    "BZPOPMAX": _all_but_last,
    "RENAME": lambda args: args[1:3], "RENAMENX": lambda args: args[1:3],
    "LMOVE": lambda args: args[1:3], "BLMOVE": lambda args: args[1:3],
    "RPOPLPUSH": lambda args: args[1:3], "BRPOPLPUSH": lambda args: args[1:3],
    "SMOVE": lambda args: args[1:3], "COPY": lambda args: args[1:3],
    "SCAN": _scan_match,
    # MEMORY USAGE key (the trimmer's measure of a stream); MEMORY STATS, DOCTOR ... have none.
    "MEMORY": lambda args: args[2:3] if len(args) > 2 and _word(args[1]) == "USAGE" else (),
}


def keys_of(args: Sequence[Arg]) -> Sequence[Arg]:
    """The keys of command `args` (empty for a keyless command)."""
    name = _word(args[0])
    if name in KEYLESS or name in BROADCAST:
        return ()
    return KEYS_OF.get(name, _first)(args)


def slot_of(args: Sequence[Arg]) -> int | None:
    """The slot command `args` must run in; None: it has no key (any primary). CrossSlot
    when its keys hash to different slots."""
    keys = keys_of(args)
    if not keys:
        return None
    first = keys[0]
    slot = key_slot(first)
    if len(keys) == 1:
        return slot
    # (a script's keys: text with one tag. A name that begins with the first's text up to its
    # tag's "}" has that tag: the same slot, not looked at again.)
    through_tag = _through_tag(first)
    for key in keys[1:]:
        if through_tag is not None and isinstance(key, str) and key.startswith(through_tag):
            continue
        other = key_slot(key)
        if other != slot:
            shown_key = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            raise CrossSlot(f"{_word(args[0])} names keys in slots {slot} and {other} "
                            f"({shown(shown_key)} is the first of the second): on a Redis "
                            "Cluster one command keeps to one slot")
    return slot


def pipeline_slots(commands: Sequence[Sequence[Arg]]) -> list[int | None]:
    """Each command's slot. Every command of a MULTI ... EXEC (or DISCARD) block, MULTI,
    EXEC and keyless ones (TIME) included, takes the slot of the block's first keyed
    command: a transaction goes whole to one node. Sent elsewhere, a keyless command ran
    alone there and its EXEC answered one reply short; an EXEC sent to the next
    transaction's node answered "EXEC without MULTI" while this one kept the MULTI open.
    Outside a block, a keyless command takes the slot of the next keyed command (else the
    previous). None: no command of the pipeline has a key (any primary)."""
    near: list[int | None] = [slot_of(args) for args in commands]
    if all(slot is None for slot in near) or all(slot is not None for slot in near):
        return near
    filled = list(near)
    start: int | None = None  # the open block's MULTI
    for i, args in enumerate(commands):
        if args and _word(args[0]) == "MULTI":
            start = i
        elif start is not None and _ends_transaction(args):
            slot = next((s for s in near[start:i + 1] if s is not None), None)
            filled[start:i + 1] = [slot] * (i + 1 - start)
            start = None
    following: int | None = None
    for i in range(len(filled) - 1, -1, -1):
        if filled[i] is None:
            filled[i] = following
        else:
            following = filled[i]
    previous: int | None = None
    for i, slot in enumerate(filled):
        if slot is None:
            filled[i] = previous
        else:
            previous = slot
    return filled


def _ends_transaction(args: Sequence[Arg]) -> bool:
    return bool(args) and _word(args[0]) in ("EXEC", "DISCARD")


def is_broadcast(args: Sequence[Arg]) -> bool:
    """A command for every primary (FUNCTION ...) or every node (an ACL change)."""
    return _word(args[0]) in BROADCAST or is_for_every_node(args)


def is_for_every_node(args: Sequence[Arg]) -> bool:
    """An ACL change: every node, replicas too (`ACL_ON_EVERY_NODE`)."""
    return len(args) > 1 and _word(args[0]) == "ACL" and _word(args[1]) in ACL_ON_EVERY_NODE
