"""The slot of a command (transport/slots.py): CRC16 with the hash tag rule, and one test per
entry of the key table, checked against what Redis itself says (CLUSTER KEYSLOT values)."""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateworker.transport.slots import (
    KEYS_OF,
    CrossSlot,
    is_broadcast,
    is_for_every_node,
    key_slot,
    pipeline_slots,
    slot_of,
)


def test_crc16_matches_redis() -> None:
    assert key_slot("123456789") == 0x31C3  # the XMODEM check value
    assert key_slot("foo") == 12182 and key_slot(b"bar") == 5061  # CLUSTER KEYSLOT foo / bar
    assert key_slot("somekey") == 11058


@pytest.mark.parametrize(("key", "hashed"), [
    ("{user1000}.following", "user1000"),
    ("foo{bar}{zap}", "bar"),  # the first tag only
    ("foo{{bar}}zap", "{bar"),  # from the first { to the first } after it
    ("foo{}{bar}", "foo{}{bar}"),  # an empty tag: the whole key
    ("foo{bar", "foo{bar"),  # no closing brace: the whole key
    ("sw:{sw:p3}:e:2:abk", "sw:p3"),
])
def test_hash_tags(key: str, hashed: str) -> None:
    assert key_slot(key) == key_slot(hashed.encode())


T, U = "{t}a", "{t}b"  # one slot
S = key_slot("t")
OTHER = "{u}"  # another slot
assert key_slot(OTHER) != S

# One case per entry of KEYS_OF (and the default): a command whose keys are all in slot S.
CASES: dict[str, list[object]] = {
    "FCALL": ["FCALL", "fn", 2, T, U, "arg-not-a-key"],
    "FCALL_RO": ["FCALL_RO", "fn", 1, T, "arg"],
    "EVAL": ["EVAL", "return 1", 1, T, "x"],
    "EVALSHA": ["EVALSHA", "abc", 2, T, U],
    "EVAL_RO": ["EVAL_RO", "return 1", 1, T],
    "EVALSHA_RO": ["EVALSHA_RO", "abc", 1, T],
    "XREAD": ["XREAD", "COUNT", 10, "BLOCK", 5, "STREAMS", T, U, "0-0", "$"],
    "XREADGROUP": ["XREADGROUP", "GROUP", "g", "c", "COUNT", 1, "STREAMS", T, ">"],
    "XINFO": ["XINFO", "GROUPS", T],
    "XGROUP": ["XGROUP", "CREATE", T, "g", "$", "MKSTREAM"],
    "OBJECT": ["OBJECT", "ENCODING", T],
    "BLMPOP": ["BLMPOP", 1, 2, T, U, "LEFT"],
    "BZMPOP": ["BZMPOP", 1, 1, T, "MIN"],
    "LMPOP": ["LMPOP", 2, T, U, "LEFT"],
    "ZMPOP": ["ZMPOP", 1, T, "MAX"],
    "SINTERCARD": ["SINTERCARD", 2, T, U],
    "ZUNION": ["ZUNION", 2, T, U],
    "ZINTER": ["ZINTER", 2, T, U],
    "ZDIFF": ["ZDIFF", 2, T, U],
    "DEL": ["DEL", T, U],
    "UNLINK": ["UNLINK", T, U],
    "EXISTS": ["EXISTS", T, U],
    "MGET": ["MGET", T, U],
    "TOUCH": ["TOUCH", T, U],
    "WATCH": ["WATCH", T, U],
    "SINTER": ["SINTER", T, U],
    "SUNION": ["SUNION", T, U],
    "SDIFF": ["SDIFF", T, U],
    "MSET": ["MSET", T, "v-not-a-key", U, "w"],
    "MSETNX": ["MSETNX", T, "v", U, "w"],
    "BLPOP": ["BLPOP", T, U, 1],
    "BRPOP": ["BRPOP", T, U, 1],
    "BZPOPMIN": ["BZPOPMIN", T, U, 1],
    "BZPOPMAX": ["BZPOPMAX", T, U, 1],
    "RENAME": ["RENAME", T, U],
    "RENAMENX": ["RENAMENX", T, U],
    "LMOVE": ["LMOVE", T, U, "LEFT", "RIGHT"],
    "BLMOVE": ["BLMOVE", T, U, "LEFT", "RIGHT", 1],
    "RPOPLPUSH": ["RPOPLPUSH", T, U],
    "BRPOPLPUSH": ["BRPOPLPUSH", T, U, 1],
    "SMOVE": ["SMOVE", T, U, "member"],
    "COPY": ["COPY", T, U],
    "SCAN": ["SCAN", 0, "MATCH", "sw:{t}:e:*", "COUNT", 100],
    "MEMORY": ["MEMORY", "USAGE", T, "SAMPLES", 0],
}


def _reference_slot(raw: bytes) -> int:
    """Redis's rule, written out plainly: CRC16 of the first non-empty {tag}, else the key."""
    start = raw.find(b"{")
    end = raw.find(b"}", start + 1) if start >= 0 else -1
    return binascii.crc_hqx(raw[start + 1:end] if end > start + 1 else raw, 0) % 16384


_names = st.text(st.sampled_from("ab{}:é\x00"), max_size=12)


@given(_names, _names)
def test_text_and_bytes_names_and_a_commands_keys_agree_with_redis(first: str, second: str
                                                                   ) -> None:
    assert key_slot(first) == key_slot(first.encode()) == _reference_slot(first.encode())
    same = _reference_slot(first.encode()) == _reference_slot(second.encode())
    command = ["FCALL", "fn", 2, first, second, "arg"]
    if same:
        assert slot_of(command) == _reference_slot(first.encode())
    else:
        with pytest.raises(CrossSlot):
            slot_of(command)


def test_every_table_entry_has_a_case() -> None:
    assert set(CASES) == set(KEYS_OF)


@pytest.mark.parametrize("name", sorted(CASES))
def test_key_positions(name: str) -> None:
    args = CASES[name]
    assert slot_of(args) == S  # type: ignore[arg-type]
    # A non-key argument moved to another slot changes nothing; a key moved raises.
    keys = [i for i, a in enumerate(args) if a in (T, U) or a == "sw:{t}:e:*"]
    moved = list(args)
    moved[keys[-1]] = OTHER if name != "SCAN" else "sw:{u}:e:*"
    if len(keys) > 1:
        with pytest.raises(CrossSlot, match="slots"):
            slot_of(moved)  # type: ignore[arg-type]
    else:
        assert slot_of(moved) == key_slot("u")  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [["GET", T], ["HSET", T, "f", "v"], ["XADD", T, "*", "f", "v"],
                                  ["ZADD", T, 1, "m"], ["XACK", T, "g", "1-0"]])
def test_default_is_argument_1(args: list[object]) -> None:
    assert slot_of(args) == S  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [["PING"], ["INFO", "cluster"], ["TIME"], ["CLIENT", "SETNAME", "x"],
                                  ["MULTI"], ["EXEC"], ["WAIT", 1, 0], ["FCALL", "fn", 0],
                                  ["SCAN", 0, "MATCH", "sw:*"], ["SCAN", 0], ["MEMORY", "STATS"]])
def test_keyless(args: list[object]) -> None:
    assert slot_of(args) is None  # type: ignore[arg-type]


def test_function_library_goes_to_every_primary() -> None:
    assert is_broadcast(["FUNCTION", "LOAD", "REPLACE", "src"])
    assert is_broadcast(["function", "flush"]) and not is_broadcast(["FCALL", "f", 0])


def test_a_script_call_across_slots_is_refused_before_it_is_sent() -> None:
    with pytest.raises(CrossSlot, match=r'FCALL names keys in slots \d+ and \d+ \("\{u\}"'):
        slot_of(["FCALL", "fn", 2, T, OTHER])


def test_acl_changes_go_to_every_node_and_acl_reads_to_one() -> None:
    for sub in ("SETUSER", "deluser", "SAVE", "LOAD"):
        assert is_for_every_node(["ACL", sub, "u"]) and is_broadcast(["acl", sub])
    for args in (["ACL", "GETUSER", "u"], ["ACL", "WHOAMI"], ["ACL", "DRYRUN", "u", "PING"],
                 ["FUNCTION", "LOAD", "x"], ["ACL"]):
        assert not is_for_every_node(args)


def test_a_transactions_exec_goes_with_its_own_commands() -> None:
    """Two MULTI ... EXEC back to back in one pipeline, their keys in other slots: each EXEC
    goes where its own commands go, not to the next transaction's node (which, once a slot
    moved, answered "EXEC without MULTI" while the first node kept the MULTI open)."""
    a, b = "{a}k", "{b}k"
    commands = [["MULTI"], ["XRANGE", a, "-", "+"], ["EXEC"],
                ["MULTI"], ["XRANGE", b, "-", "+"], ["EXEC"], ["PING"]]
    slots = pipeline_slots(commands)
    assert slots == [key_slot(a)] * 3 + [key_slot(b)] * 4


def test_a_keyless_command_inside_a_transaction_goes_with_it() -> None:
    """A keyless command queued in a transaction (a watch's TIME, last before EXEC) goes to
    its transaction's node, never to the next transaction's: sent there, it ran alone and
    the EXEC answered one reply short (a watch's read failed while a slot moved)."""
    a, b = "{a}k", "{b}k"
    commands = [["MULTI"], ["XINFO", "STREAM", a], ["TIME"], ["EXEC"],
                ["MULTI"], ["TIME"], ["XRANGE", b, "-", "+"], ["TIME"], ["EXEC"],
                ["TIME"], ["XRANGE", a, "-", "+"]]
    slots = pipeline_slots(commands)
    assert slots == [key_slot(a)] * 4 + [key_slot(b)] * 5 + [key_slot(a)] * 2
