"""state::list_entries (lua/pages.lua), after iii's own pagination tests: pages of a snapshot
(later writes unseen), offset/total/done/next_cursor, byte-cut pages that never pass max_bytes
and a row too large refused, single-use cursors bound to scope, caller, limit and max_bytes,
the limits, the bounds, and two callers racing on one cursor."""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stateworker import StateError, StateStore
from stateworker.schemas import EntriesPage
from stateworker.state.kv import pages
from tests.integration.busproto import until
from tests.servers import RedisServer

pytestmark = pytest.mark.anyio
FN = "state::list_entries"


async def page(store: StateStore, body: dict[str, Any], caller: str = "c") -> dict[str, Any]:
    result: dict[str, Any] = await store.call(FN, body, caller=caller)
    return result


async def raw_page(store: StateStore, body: dict[str, Any], caller: str = "c") -> bytes:
    return await store.call_json(FN, json.dumps(body), caller=caller)


async def refusal(store: StateStore, body: dict[str, Any], caller: str | None = "c"
                  ) -> StateError:
    with pytest.raises(StateError) as refused:
        await store.call(FN, body, caller=caller)
    return refused.value


async def snapshots(store: StateStore, scope: str) -> list[bytes]:
    """The snapshot keys of the scope's partition (none once every listing ended)."""
    part = store.state.keys.for_scope(scope)
    found: list[bytes] = await store.state.conn.execute("KEYS", f"{part.tag}snap:*")
    return found


async def test_an_empty_scope_is_one_last_page(store: StateStore, scope: str) -> None:
    assert await page(store, {"scope": scope}) == {
        "entries": [], "done": True, "next_cursor": None, "offset": 0, "total": 0}
    assert await snapshots(store, scope) == []


async def test_pages_cover_the_snapshot_and_later_writes_are_not_seen(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "a", None)
    single = await page(store, {"scope": scope, "limit": 1})
    assert single["done"] and single["entries"] == [["a", None]]
    await store.set(scope, "b", {"old": True})
    await store.set(scope, "c", "deleted later")
    first = await page(store, {"scope": scope, "limit": 1})
    assert (first["entries"], first["done"], first["offset"], first["total"]) == (
        [["a", None]], False, 0, 3)
    token = first["next_cursor"]
    assert str(uuid.UUID(token)) == token
    await store.set(scope, "b", {"new": True})
    await store.delete(scope, "c")
    await store.set(scope, "inserted", 42)
    second = await page(store, {"scope": scope, "limit": 1, "cursor": token})
    assert second["entries"] == [["b", {"old": True}]] and second["offset"] == 1
    assert (await refusal(store, {"scope": scope, "limit": 1, "cursor": token})).code == \
        "INVALID_CURSOR"  # read once
    third = await page(store, {"scope": scope, "limit": 1, "cursor": second["next_cursor"]})
    assert third == {"entries": [["c", "deleted later"]], "done": True, "next_cursor": None,
                     "offset": 2, "total": 3}
    assert await snapshots(store, scope) == []  # the last page freed it
    assert await store.state.conn.execute(
        "ZCARD", store.state.keys.for_scope(scope).snapshots) == 0


async def test_a_cursor_serves_only_its_scope_caller_limit_and_max_bytes(
        store: StateStore, scope: str) -> None:
    for key in ("a", "b"):
        await store.set(scope, key, key)
    body = {"scope": scope, "limit": 1, "max_bytes": 1_000_000}
    token = (await page(store, body))["next_cursor"]
    await store.set(scope + "-other", "a", 1)
    for changed, caller in (({"scope": scope + "-other"}, "c"), ({}, "other"),
                            ({"limit": 2}, "c"), ({"max_bytes": 999_999}, "c"),
                            ({"cursor": str(uuid.uuid4())}, "c"), ({"cursor": "tampered"}, "c"),
                            ({"cursor": token.upper()}, "c")):
        refused = await refusal(store, {**body, "cursor": token, **changed}, caller)
        assert refused.code == "INVALID_CURSOR", changed
        assert refused.details == {"path": "$.cursor"}
    assert (await page(store, {**body, "cursor": token}))["entries"] == [["b", "b"]]
    missing = await refusal(store, {"scope": scope}, caller=None)
    assert missing.code == "UNKNOWN_CALLER"


async def test_an_expired_snapshot_is_an_invalid_cursor(store: StateStore, scope: str) -> None:
    for key in ("a", "b"):
        await store.set(scope, key, key)
    first = await page(store, {"scope": scope, "limit": 1})
    (name,) = await snapshots(store, scope)
    ttl = await store.state.conn.execute("PTTL", name)
    assert 0 < ttl <= pages.LIFE_MS
    await store.state.conn.execute("PEXPIRE", name, 1)
    await until(lambda: snapshots_gone(store, scope), 5, "the snapshot to expire")
    refused = await refusal(store, {"scope": scope, "limit": 1, "cursor": first["next_cursor"]})
    assert refused.code == "INVALID_CURSOR"


async def drop_snapshots(store: StateStore, scope: str) -> None:
    part = store.state.keys.for_scope(scope)
    await store.state.conn.execute("DEL", part.snapshots, *await snapshots(store, scope))


async def snapshots_gone(store: StateStore, scope: str) -> bool:
    return await snapshots(store, scope) == []


async def test_pages_never_extend_a_snapshots_life(store: StateStore, scope: str) -> None:
    for key in ("a", "b", "c"):
        await store.set(scope, key, None)
    first = await page(store, {"scope": scope, "limit": 1})
    (name,) = await snapshots(store, scope)
    expires = await store.state.conn.execute("PEXPIRETIME", name)
    second = await page(store, {"scope": scope, "limit": 1, "cursor": first["next_cursor"]})
    (renamed,) = await snapshots(store, scope)
    assert renamed != name and renamed.decode().endswith(second["next_cursor"])
    assert await store.state.conn.execute("PEXPIRETIME", renamed) == expires
    last = await page(store, {"scope": scope, "limit": 1, "cursor": second["next_cursor"]})
    assert last["done"] and await snapshots(store, scope) == []


@pytest.mark.parametrize("limits", [{"limit": 0}, {"limit": 1001}, {"max_bytes": 255},
                                    {"max_bytes": 8_000_001}, {"limit": -1}])
async def test_limits_out_of_range_are_refused(store: StateStore, scope: str,
                                               limits: dict[str, int]) -> None:
    refused = await refusal(store, {"scope": scope, **limits})
    (field,) = limits
    assert refused.code == "INVALID_REQUEST" and refused.details["path"] == f"$.{field}"
    assert field in refused.message and str(refused.details["limit"]) in refused.message


async def test_two_callers_racing_on_one_cursor_get_the_page_once(
        store: StateStore, scope: str) -> None:
    for key in ("a", "b", "c"):
        await store.set(scope, key, key)
    token = (await page(store, {"scope": scope, "limit": 1}))["next_cursor"]
    outcomes: list[Any] = []

    async def read() -> None:
        try:
            outcomes.append(await page(store, {"scope": scope, "limit": 1, "cursor": token}))
        except StateError as exc:
            outcomes.append(exc.code)

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(read)
    assert sorted(o if isinstance(o, str) else "page" for o in outcomes) == [
        "INVALID_CURSOR"] * 3 + ["page"]


async def test_an_escaped_key_is_counted_to_the_exact_byte(store: StateStore,
                                                           scope: str) -> None:
    key = '中文\n"\\\x01' * 80
    await store.set(scope, key, 'é\n"\\\x00' * 30)
    await store.set(scope, "\U0001d537later", None)  # (after it in byte order)
    size = len(await raw_page(store, {"scope": scope, "limit": 1}))
    exact = await raw_page(store, {"scope": scope, "limit": 1, "max_bytes": size})
    assert len(exact) == size and not msgspec.json.decode(exact)["done"]
    refused = await refusal(store, {"scope": scope, "limit": 1, "max_bytes": size - 1})
    assert refused.code == "ROW_TOO_LARGE" and refused.details["limit"] == size - 1


async def test_a_row_too_large_is_refused_never_skipped(store: StateStore, scope: str) -> None:
    await store.set(scope, "a-small", None)
    await store.set(scope, "b-large", "x" * 500)
    body = {"scope": scope, "max_bytes": 256}
    first = await page(store, body)
    assert first["entries"] == [["a-small", None]] and not first["done"]
    refused = await refusal(store, {**body, "cursor": first["next_cursor"]})
    assert refused.code == "ROW_TOO_LARGE"
    assert refused.details == {"path": "$.max_bytes", "offset": 1, "size": 514, "limit": 256}
    assert len(await snapshots(store, scope)) == 1  # the cursor is not used up
    again = await refusal(store, {**body, "cursor": first["next_cursor"]})
    assert again.code == "ROW_TOO_LARGE"


async def test_a_row_over_the_largest_page_is_refused_at_capture(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=pages.MAX_BYTES + 16,
                               max_call_bytes=4 * pages.MAX_BYTES) as store:
        await store.set(scope, "secret-key", "x" * pages.MAX_BYTES)
        refused = await refusal(store, {"scope": scope, "max_bytes": pages.MAX_BYTES})
        assert refused.code == "ROW_TOO_LARGE" and refused.details["limit"] == pages.MAX_BYTES
        assert "secret-key" not in refused.message
        assert await snapshots(store, scope) == []


async def test_a_snapshot_over_max_call_bytes_is_refused(
        redis_server: RedisServer, prefix: str, scope: str) -> None:
    async with StateStore.open(redis_server.url, prefix=prefix, partitions=4,
                               max_value_bytes=1000, max_call_bytes=2000) as store:
        for i in range(5):
            await store.set(scope, f"k{i}", "x" * 600)
        refused = await refusal(store, {"scope": scope})
        assert refused.code == "SNAPSHOT_CAPACITY"
        assert refused.details["bound"] == "bytes" and refused.details["limit"] == 2000
        assert "max_call_bytes" in refused.message
        await store.delete(scope, "k4")
        await store.delete(scope, "k3")
        assert (await page(store, {"scope": scope}))["total"] == 3


async def test_an_index_past_max_entries_is_refused_before_it_is_read(
        store: StateStore, scope: str) -> None:
    """The bound is the scope's keys, read at most one past it: an index of more keys is
    refused even when few of them are live (here one live entry beside index members whose
    entries are gone, what expired entries leave until the reaper drops them)."""
    await store.set(scope, "live", 1)
    index = store.state.keys.for_scope(scope).key_index(scope)
    stale = [f"gone-{i:06d}" for i in range(pages.MAX_ENTRIES + 10)]
    await store.state.conn.execute("ZADD", index, *(x for m in stale for x in (0, m)))
    refused = await refusal(store, {"scope": scope})
    assert refused.code == "SNAPSHOT_CAPACITY" and refused.details["bound"] == "entries"
    assert refused.details["limit"] == pages.MAX_ENTRIES
    assert refused.details["found"] == pages.MAX_ENTRIES + 11
    assert "pages.MAX_ENTRIES" in refused.message and str(pages.MAX_ENTRIES) in refused.message
    assert await snapshots(store, scope) == []


async def test_live_snapshots_are_bounded_and_a_live_cursor_outlives_a_refusal(
        store: StateStore, scope: str) -> None:
    for key in ("a", "b"):
        await store.set(scope, key, None)
    tokens = [(await page(store, {"scope": scope, "limit": 1}, f"c{i}"))["next_cursor"]
              for i in range(pages.MAX_SNAPSHOTS)]  # (one each: a caller's share is smaller)
    refused = await refusal(store, {"scope": scope, "limit": 1}, "late")
    assert refused.code == "SNAPSHOT_CAPACITY" and refused.details["bound"] == "snapshots"
    assert refused.details["limit"] == pages.MAX_SNAPSHOTS
    assert (await page(store, {"scope": scope, "limit": 1, "cursor": tokens[0]}, "c0"))["done"]
    assert (await page(store, {"scope": scope, "limit": 1}, "late"))["next_cursor"]  # room


async def test_bytes_cut_before_the_count_and_the_last_page_is_exact(
        store: StateStore, scope: str) -> None:
    for i in range(7):
        await store.set(scope, f"key-{i}", '中文"\n' * 30)
    body: dict[str, Any] = {"scope": scope, "limit": 1000, "max_bytes": 600}
    seen: list[Any] = []
    count = 0
    while True:
        raw = await raw_page(store, body)
        got = msgspec.json.decode(raw)
        assert len(raw) <= 600 and got["entries"]
        assert (got["offset"], got["total"]) == (len(seen), 7)
        seen += got["entries"]
        count += 1
        if got["done"]:
            assert got["next_cursor"] is None
            break
        body["cursor"] = got["next_cursor"]
    assert [key for key, _ in seen] == [f"key-{i}" for i in range(7)] and count > 1
    other = scope + "-one"
    await store.set(other, 'terminal\n"', "中文" * 100)
    size = len(await raw_page(store, {"scope": other}))
    assert (await page(store, {"scope": other, "max_bytes": size}))["done"]
    refused = await refusal(store, {"scope": other, "max_bytes": size - 1})
    assert refused.code == "ROW_TOO_LARGE"


async def test_a_whole_last_tail_fits_where_its_first_row_with_a_cursor_would_not(
        store: StateStore, scope: str) -> None:
    await store.set(scope, "a", "x" * 150)
    await store.set(scope, "b", None)
    raw = await raw_page(store, {"scope": scope, "limit": 2, "max_bytes": 256})
    got = msgspec.json.decode(raw)
    assert got["done"] and len(got["entries"]) == 2 and len(raw) <= 256
    assert await snapshots(store, scope) == []


# ---- the cut, for any rows --------------------------------------------------------------------
def last_page_bytes(rows: list[bytes], offset: int, total: int) -> int:
    """The JSON bytes of a last page holding `rows` (no cursor)."""
    return len(msgspec.json.encode(EntriesPage([msgspec.Raw(r) for r in rows], True, None,
                                               offset, total)))


def page_with_cursor_bytes(rows: list[bytes], offset: int, total: int) -> int:
    """The JSON bytes of a page holding `rows` that is not the last (a cursor: a UUID)."""
    return len(msgspec.json.encode(EntriesPage([msgspec.Raw(r) for r in rows], False,
                                               str(uuid.UUID(int=0)), offset, total)))


def fits_no_page(rows: list[bytes], offset: int, limit: int, max_bytes: int) -> bool:
    """The row at `offset` is on no page within `max_bytes`: not with the whole tail as the
    last page (when the tail is within `limit`), nor alone on a page with a cursor."""
    tail = rows[offset:]
    if len(tail) <= limit and last_page_bytes(tail, offset, len(rows)) <= max_bytes:
        return False
    return len(tail) == 1 or \
        page_with_cursor_bytes(tail[:1], offset, len(rows)) > max_bytes


scopes = st.dictionaries(st.text(max_size=12),
                         st.one_of(st.none(), st.integers(), st.text(max_size=150)), max_size=16)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(stored=scopes, limit=st.integers(1, 8), max_bytes=st.integers(256, 600))
@example(stored={"a": "x" * 200, "b": None}, limit=1, max_bytes=256)  # fits only as a last page
async def test_pages_are_the_most_that_fit_and_cover_the_scope(
        store: StateStore, stored: dict[str, Any], limit: int, max_bytes: int) -> None:
    scope = f"prop-{uuid.uuid4().hex[:8]}"
    for name, value in stored.items():
        await store.set(scope, name, value)
    order = sorted(stored, key=str.encode)
    rows = [msgspec.json.encode([name, stored[name]]) for name in order]
    body: dict[str, Any] = {"scope": scope, "limit": limit, "max_bytes": max_bytes}
    try:
        await walk(store, body, rows, limit, max_bytes)
    finally:  # (a failed walk leaves its snapshot: drop it, the next example needs room)
        await drop_snapshots(store, scope)


async def walk(store: StateStore, body: dict[str, Any], rows: list[bytes], limit: int,
               max_bytes: int) -> None:
    """Every page of the listing, each checked against `rows` (the scope, in key order)."""
    offset = 0
    while True:
        try:
            raw = await raw_page(store, body)
        except StateError as exc:  # the next row fits no page on its own
            assert exc.code == "ROW_TOO_LARGE" and exc.details["offset"] == offset
            assert fits_no_page(rows, offset, limit, max_bytes)
            break
        got = msgspec.json.decode(raw, type=EntriesPage)
        held = [bytes(row) for row in got.entries]
        assert len(raw) <= max_bytes and (0 < len(held) <= limit or not rows)
        assert held == rows[offset:offset + len(held)] and got.total == len(rows)
        assert got.offset == offset
        offset += len(held)
        if got.done:
            assert offset == len(rows) and got.next_cursor is None
            break
        if len(held) < limit:  # cut by bytes: one row more would not fit
            assert len(raw) + 1 + len(rows[offset]) > max_bytes
            rest = rows[got.offset:]
            assert len(rest) > limit or last_page_bytes(rest, got.offset, len(rows)) > max_bytes
        body["cursor"] = got.next_cursor
