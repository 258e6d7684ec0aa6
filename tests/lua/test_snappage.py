"""snappage.lua against real Redis: a page of a stream of unsaved records, bounded in entries
and in bytes, one entry at least however large, and the next page from where it ended reads
every entry once, in order."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.scripts.replies import Page
from stateworker.scripts.upkeep_bindings import SNAPPAGE, snappage_call
from stateworker.transport.plans import pipeline

pytestmark = pytest.mark.anyio


async def page(store: StateStore, stream: str, start: str, most: int, max_bytes: int) -> Page:
    state = store.state
    (reply,) = await pipeline(state.conn, state.library, [SNAPPAGE.command(
        state.library, *snappage_call(stream, start, most, max_bytes))])
    return SNAPPAGE.read(reply)


async def test_pages_end_at_their_bytes_or_entries_and_read_every_entry_once(
        store: StateStore, scope: str) -> None:
    stream = store.state.keys.for_scope(scope).unsaved_calls
    sizes = [10, 300_000, 10, 10, 300_000, 300_000, 10] + [10] * 40
    ids = [await store.state.conn.execute("XADD", stream, "*", "v", "x" * size)
           for size in sizes]
    got: list[list[int]] = []
    start = "-"
    while True:
        read = await page(store, stream, start, 20, 250_000)
        if read.entries:
            got.append([len(flat[1]) for _, flat in read.entries])
            start = "(" + read.entries[-1][0].decode()
        if not read.more:
            break
    # (each page ends after the entry that reaches 250,000 bytes, or at 20 entries)
    assert got == [[10, 300_000], [10, 10, 300_000], [300_000], [10] * 20, [10] * 20, [10]]
    assert [e for p in got for e in p] == sizes
    read = await page(store, stream, "(" + ids[-1].decode(), 20, 250_000)
    assert (read.more, read.entries) == (False, [])
    read = await page(store, stream, "-", 20, 1)  # (one entry at least)
    assert (read.more, len(read.entries)) == (True, 1)
