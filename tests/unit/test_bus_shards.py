"""A sharded bus's names and its rule to pick a shard (docs/bus-protocol.md, "Shards"): what
programs in other languages compute too, so the rule is restated here from the docs."""

from __future__ import annotations

import zlib

import pytest

from stateworker.bus.protocol import Shards, caller_shards
from stateworker.errors import ConfigError
from stateworker.keys import BusKeys, KeySpace, bus_shard_of_stream, bus_shard_stream, bus_stream
from stateworker.settings import Settings


def hash_tag(name: str) -> str:
    """What Redis Cluster hashes of a key: the text between its first `{` and the next `}`
    when not empty, else the whole name."""
    start = name.find("{")
    end = name.find("}", start + 1)
    return name[start + 1:end] if start >= 0 and end > start + 1 else name


def test_shard_0_is_the_service_stream_byte_for_byte_and_shard_i_has_partition_is_tag() -> None:
    assert bus_shard_stream("sw", "orders", 0) == bus_stream("sw", "orders") == "sw:bus:orders"
    assert bus_shard_stream("sw", "orders", 2) == "sw:bus:orders:{sw:p2}"
    keys = KeySpace("sw", 16)
    for n in range(1, 16):
        assert hash_tag(bus_shard_stream("sw", "orders", n)) == hash_tag(keys.partition(n).events)
    assert BusKeys("sw", "orders").streams == ["sw:bus:orders"]
    assert BusKeys("sw", "orders", 3).streams == [
        "sw:bus:orders", "sw:bus:orders:{sw:p1}", "sw:bus:orders:{sw:p2}"]
    assert BusKeys("sw", "orders", 3).stream == "sw:bus:orders"  # (records keep their names)


@pytest.mark.parametrize("service", ["orders", "a:b", "a-b:c", "state"])
def test_a_shard_stream_reads_back_as_its_service_and_shard(service: str) -> None:
    for n in range(4):
        assert bus_shard_of_stream("sw", bus_shard_stream("sw", service, n)) == (service, n)


def test_a_call_goes_to_its_scopes_partition_mod_shards_else_by_its_id() -> None:
    shards = Shards([f"s{n}" for n in range(3)], 16)
    for scope in ["orders", "customers", "ü-scope", "", "a:b"]:
        want = zlib.crc32(scope.encode()) % 16 % 3
        body = b'{"key":"k","scope":' + f'"{scope}"'.encode() + b',"value":[1,{"scope":"x"}]}'
        assert shards.stream_for(body, "any-id") == f"s{want}"
        assert shards.stream_for(body.decode(), "other") == f"s{want}"
    for body in [b"{}", b'{"scope":7}', b"not json", b"[1,2]", b'{"scope":"\\ud800"}']:
        for call_id in ["c-1", "c-2", "c-3", "c-4"]:
            assert shards.stream_for(body, call_id) == f"s{zlib.crc32(call_id.encode()) % 3}", body
    one = Shards(["only"], 16)
    assert one.stream_for(b"not even looked at", "id") == "only"


def test_callers_shard_by_the_setting_except_a_principals_own_stream() -> None:
    settings = Settings(redis_url="redis://h", prefix="sw", partitions=4, bus_shards=3)
    assert caller_shards(settings, "orders", "sw:bus:orders").streams == [
        "sw:bus:orders", "sw:bus:orders:{sw:p1}", "sw:bus:orders:{sw:p2}"]
    acl = Settings(redis_url="redis://h", prefix="sw", partitions=4, bus_shards=3, auth="acl")
    mine = "sw:bus:orders:from:alice"
    assert caller_shards(acl, "orders", mine).streams == [mine]


@pytest.mark.parametrize(("shards", "partitions"), [(0, 16), (65, 128), (5, 4), (-1, 16)])
def test_bus_shards_out_of_range_names_the_setting_and_the_limits(shards: int,
                                                                  partitions: int) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings(bus_shards=shards, partitions=partitions)
    text = str(caught.value)
    assert "STATEWORKER_BUS_SHARDS" in text and "1..64" in text
    assert f"partitions ({partitions}" in text and f"got {shards}" in text


def test_bus_shards_from_the_environment() -> None:
    env = {"STATEWORKER_BUS_SHARDS": "3"}
    assert Settings.from_env(env).bus_shards == 3
    assert Settings.from_env({}).bus_shards == 1
