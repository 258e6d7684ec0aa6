"""A resumable reader of one partition's event stream.

Its cursor is the last stream id it EXAMINED, not the last event it returned: a filter (one
scope, one key) never makes it read the same entries twice, and a scope's events behind any
number of other scopes' are still reached, page by page (XRANGE ... COUNT bounds the entries
examined per round trip, not the events found).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from stateworker.errors import Unavailable
from stateworker.events.model import Event, decode_event, fields_of
from stateworker.keys import KeySpace
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import ConnectionLost

START = "-"  # the cursor before the first event of a stream
PAGE = 1000  # stream entries examined per round trip


class Page(NamedTuple):
    events: list[Event]
    cursor: str  # the last stream id examined; pass it back to go on
    done: bool  # the stream's end was reached (at the time of the read)


class PartitionReader:
    """Reads one partition's events after a cursor, optionally only one scope (and key)."""

    def __init__(self, conn: RedisConnection, keys: KeySpace, partition: int, *,
                 scope: str | None = None, key: str | None = None) -> None:
        self.conn = conn
        self.stream = keys.partition(partition).events
        self.scope = None if scope is None else scope.encode()
        self.key = None if key is None else key.encode()

    def wanted(self, fields: dict[bytes, bytes]) -> bool:
        return ((self.scope is None or fields[b"scope"] == self.scope)
                and (self.key is None or fields[b"key"] == self.key))

    def sift(self, entries: list[Any]) -> Iterator[tuple[bytes, Event | None]]:
        """Each stream entry's id with its event, or None when the filter passes it over (a
        watch still counts it as examined)."""
        for entry_id, flat in entries:
            fields = fields_of(flat)
            yield entry_id, decode_event(entry_id, fields) if self.wanted(fields) else None

    async def page(self, after: str = START, count: int = PAGE) -> Page:
        """Examine at most `count` entries after `after` (exclusive)."""
        start = START if after == START else "(" + after
        try:
            entries: list[Any] = await self.conn.execute("XRANGE", self.stream, start, "+",
                                                         "COUNT", count)
        except ConnectionLost as exc:
            raise Unavailable(f"Redis unavailable: {exc}") from exc
        events = [event for _, event in self.sift(entries) if event is not None]
        cursor = entries[-1][0].decode() if entries else after
        return Page(events, cursor, len(entries) < count)

    async def read_all(self, after: str = START, page: int = PAGE) -> Page:
        """Every wanted event after `after` up to the stream's end, page by page."""
        events: list[Event] = []
        while True:
            got = await self.page(after, page)
            events += got.events
            after = got.cursor
            if got.done:
                return Page(events, after, True)


async def scope_events(conn: RedisConnection, keys: KeySpace, scope: str,
                       after: str = START) -> list[Event]:
    """The events of one scope still in its partition's stream, after revision `after`."""
    reader = PartitionReader(conn, keys, keys.partition_of(scope), scope=scope)
    return (await reader.read_all(after)).events
