"""Every Redis key and stream name, built in one place.

Scopes hash (CRC32 of their UTF-8 bytes) into a fixed number of partitions. Every key of one
partition carries the Redis Cluster hash tag `{<prefix>:p<n>}`, so each script, which touches
one entry and the indexes and event stream of its partition, runs on a single cluster slot.

Layout (`sw` prefix, partition 3):
  sw:{sw:p3}:e:<len(scope)>:<scope><key>  hash   one entry: v value, n version, h hash,
                                                 t topic, c/u created/updated ms, x expires
                                                 ms, b updated_by, r revision, s plain
  sw:{sw:p3}:k:<scope>                    zset   the scope's keys, score 0, byte order
  sw:{sw:p3}:u:<scope>                    zset   the scope's keys by updated_at ms
  sw:{sw:p3}:t:<scope>                    zset   <topic>\0<key> of tagged entries, score 0
  sw:{sw:p3}:scopes                       zset   scopes of the partition with >= 1 entry
  sw:{sw:p3}:ttl                          zset   <len>:<scope><key> by expires_at ms
  sw:{sw:p3}:events                       stream change events; entry id = revision
  sw:{sw:p3}:call:<call id>               string a bus call's recorded reply (msgpack)
  sw:meta                                 hash   layout facts checked at start (partitions)
The scope is length-prefixed inside entry names, so any scope and key (":" included) map to one
name and the reaper can split a ttl member back into scope and key.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """The names shared by every scope of one partition."""

    tag: str  # "sw:{sw:p3}:" -- every name of the partition starts with it
    scopes: str
    ttl: str
    events: str
    entry_prefix: str  # + "<len>:<scope><key>" gives an entry

    def entry(self, scope: str, key: str) -> str:
        return f"{self.entry_prefix}{member(scope, key)}"

    def key_index(self, scope: str) -> str:
        return f"{self.tag}k:{scope}"

    def updated_index(self, scope: str) -> str:
        return f"{self.tag}u:{scope}"

    def topic_index(self, scope: str) -> str:
        return f"{self.tag}t:{scope}"

    def call_record(self, call_id: str) -> str:
        """Where an entry script keeps a bus call's reply (exactly once per call id)."""
        return f"{self.tag}call:{call_id}"

    def entry_keys(self, scope: str, key: str) -> list[str]:
        """KEYS[1..7] of the entry scripts (set, delete, update, topic)."""
        return [self.entry(scope, key), *self._scope_keys(scope)]

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one PartitionKeys per partition, kept
    def _scope_keys(self, scope: str) -> tuple[str, ...]:
        return (self.key_index(scope), self.updated_index(scope), self.topic_index(scope),
                self.scopes, self.ttl, self.events)


def member(scope: str, key: str) -> str:
    """The length-prefixed scope+key used in entry names and the ttl index."""
    return f"{len(scope.encode())}:{scope}{key}"


class KeySpace:
    """Builds the names for one prefix and partition count."""

    def __init__(self, prefix: str, partitions: int) -> None:
        self.prefix = prefix
        self.partitions = partitions
        self.meta = f"{prefix}:meta"
        self._parts = [self._build(n) for n in range(partitions)]

    def _build(self, n: int) -> PartitionKeys:
        tag = f"{self.prefix}:{{{self.prefix}:p{n}}}:"
        return PartitionKeys(
            tag=tag,
            scopes=f"{tag}scopes",
            ttl=f"{tag}ttl",
            events=f"{tag}events",
            entry_prefix=f"{tag}e:",
        )

    def partition_of(self, scope: str) -> int:
        return zlib.crc32(scope.encode()) % self.partitions

    def for_scope(self, scope: str) -> PartitionKeys:
        return self._parts[self._partition_of(scope)]

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one KeySpace per store, kept
    def _partition_of(self, scope: str) -> int:
        return self.partition_of(scope)

    def partition(self, n: int) -> PartitionKeys:
        return self._parts[n]

    def all_partitions(self) -> list[PartitionKeys]:
        return list(self._parts)
