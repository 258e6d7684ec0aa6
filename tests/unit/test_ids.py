"""A client's call ids (bus/ids.py): unique, and on a cluster homed in the partition asked
for (KeySpace.id_home), whatever order the partitions are asked in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stateworker.bus.entries import parse_entry
from stateworker.bus.ids import SPARE_PER_PARTITION, CallIds, body_partition
from stateworker.bus.protocol import BusOptions, call_entry
from stateworker.keys import KeySpace, call_field


@given(st.integers(1, 16), st.lists(st.integers(0, 15), max_size=300), st.sampled_from(
    [None, "alice"]))
def test_ids_are_unique_and_at_home(partitions: int, asked: list[int], principal: str | None
                                    ) -> None:
    """(Up to 16 partitions a draw of SEARCH_LIMIT ids finds none at home with probability
    (15/16)**256 = 7e-8; with more, a call may take an id homed elsewhere: `new`'s doc.)"""
    keys = KeySpace("sw", partitions)
    ids = CallIds(keys, principal)
    owner = "" if principal is None else f"{principal}/"
    made = []
    for n in asked:
        partition = n % partitions
        call_id = ids.new(partition)
        assert keys.id_home(call_field(owner + call_id)) == partition
        made.append(call_id)
    assert len(set(made)) == len(made)
    assert all(len(kept) <= SPARE_PER_PARTITION for kept in ids._spare.values())


def test_ids_stay_unique_with_many_partitions() -> None:
    keys = KeySpace("sw", 1024)
    ids = CallIds(keys)
    made = [ids.new(n % 1024) for n in range(3000)]
    assert len(set(made)) == len(made)


def test_one_redis_ids_are_drawn_in_order() -> None:
    ids = CallIds()
    first, second = ids.new(3), ids.new()
    prefix = first.rpartition("-")[0]
    assert (first, second) == (f"{prefix}-0", f"{prefix}-1")


def test_body_partition_is_the_scopes() -> None:
    keys = KeySpace("sw", 16)
    assert body_partition(keys, b'{"scope":"orders","key":"o"}') == keys.partition_of("orders")
    assert body_partition(keys, '{"key":"o"}') is None
    assert body_partition(keys, b"not json") is None
    assert body_partition(keys, b'{"scope":7}') is None
    assert body_partition(keys, '{"scope":"\\ud800"}') is None  # (a lone surrogate)


def test_an_acl_principals_ids_are_at_home_as_the_service_reads_them() -> None:
    """The service binds `<principal>/<id>` (parse_entry): the client's ids are homed by it."""
    keys = KeySpace("sw", 16)
    ids = CallIds(keys, "alice")
    for partition in (0, 5, 15):
        call_id = ids.new(partition)
        flat = call_entry("sw:bus:state:from:alice", call_id, "state::get", b"{}", "r")[3:]
        call, _, _, error, _ = parse_entry(("sw:bus:state:from:alice", b"1-0"),
                                        [f if isinstance(f, bytes) else str(f).encode()
                                         for f in flat], BusOptions(), principal="alice")
        assert error is None and call is not None and call.ctx.call_id == f"alice/{call_id}"
        assert keys.id_home(call_field(call.ctx.call_id)) == partition
