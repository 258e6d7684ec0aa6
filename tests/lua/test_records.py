"""Call records (lua/includes/records.lua, bind.lua, entry.lua): found for the whole dedupe
window across its time slices and despite a replica's clock a slice behind, kept no shorter
than the window and dropped after it, one field per call on one Redis; on a cluster the
record is the partition's and the id is bound in a step. Time is the scripts' argument, so
the tests move the clock the plans read (bindings.now_ms), not the machine's."""

from __future__ import annotations

import hashlib
import itertools

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateStore
from stateworker.clock import now_ms
from stateworker.context import CallContext
from stateworker.errors import CallIdReused
from stateworker.keys import call_field
from stateworker.scripts import bindings
from stateworker.scripts.bindings import DIGEST_BYTES, slice_ms
from stateworker.state import functions

pytestmark = pytest.mark.anyio

_ids = itertools.count()


class Clock:
    """The time the plans put in their scripts' arguments."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ms = now_ms()
        monkeypatch.setattr(bindings, "now_ms", lambda: self.ms)


def bus(fn: str, body: dict[str, object], call_id: str) -> tuple[str, bytes, CallContext]:
    """A bus call as the runtime prepares it (its digest: SHA-1 of function and body)."""
    raw = msgspec.json.encode(body)
    digest = hashlib.sha1(fn.encode() + b"\0" + raw).hexdigest()
    return fn, raw, CallContext(call_id=call_id, call_digest=digest)


async def run(store: StateStore, fn: str, body: bytes, ctx: CallContext) -> object:
    return await store.state.execute(functions.prepare(store.state, fn, body, ctx))


async def test_a_retry_is_answered_from_the_record_for_the_whole_window(
        store: StateStore, scope: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    window = store.state.settings.dedupe_window_ms
    call = bus("state::update", {"scope": scope, "key": "n", "ops": [
        {"type": "increment", "path": "", "by": 1}]}, f"win-{next(_ids)}")
    ms = slice_ms(store.state.settings)
    clock.ms = (clock.ms // ms + 1) * ms + 1  # just after a slice began
    first = await run(store, *call)
    start = clock.ms
    # Retries across every slice boundary of the window, and from a replica whose clock is
    # 2 s behind the writer's (so still in the slice before): each the recorded reply,
    # nothing applied again.
    for offset in (*range(0, window, window // 20), window - 1, -2000):
        clock.ms = start + offset
        assert await run(store, *call) == first, offset
    assert await store.get(scope, "n") == 1
    assert len(await store.events(scope)) == 1
    # Past the window and the slice it ended in, the id is a new call.
    clock.ms = start + window + 2 * ms
    await run(store, *call)
    assert await store.get(scope, "n") == 2


async def test_the_record_is_kept_at_least_the_window_and_at_most_a_slice_more(
        store: StateStore, scope: str, raw: aredis.Redis) -> None:
    settings = store.state.settings
    call_id = f"keep-{next(_ids)}"
    await run(store, *bus("state::set", {"scope": scope, "key": "k", "value": 1}, call_id))
    written = now_ms()
    field, ms = call_field(call_id), slice_ms(settings)
    name = store.state.keys.call_ids(field, written // ms)
    if not await raw.hexists(name, field):  # (a slice began between)
        name = store.state.keys.call_ids(field, written // ms - 1)
    value = await raw.hget(name, field)
    assert value is not None and len(value) > DIGEST_BYTES  # digest + reply: one field
    assert await raw.object("encoding", name) == b"hashtable"  # (lookups do not scan it)
    kept = await raw.pttl(name)
    assert settings.dedupe_window_ms - (now_ms() - written) - 50 <= kept
    assert kept <= settings.dedupe_window_ms + ms


async def test_a_refused_reuse_writes_nothing_and_a_read_binds_its_id(
        store: StateStore, scope: str) -> None:
    call_id = f"reuse-{next(_ids)}"
    await run(store, *bus("state::get", {"scope": scope, "key": "k"}, call_id))
    with pytest.raises(CallIdReused):  # bound by the read, in another partition's script
        await run(store, *bus("state::set", {"scope": scope + "x", "key": "k", "value": 1},
                              call_id))
    assert await store.get(scope + "x", "k") is None
    assert await store.events(scope + "x") == []


@pytest.mark.parametrize("cluster", [False, True])
async def test_an_id_reused_in_another_partition_is_refused(
        store: StateStore, cluster: bool) -> None:
    store.state.cluster = cluster
    keys = store.state.keys
    first, second = "acct-a", next(f"acct-{n}" for n in range(100)
                                   if keys.partition_of(f"acct-{n}") != keys.partition_of("acct-a"))
    call_id = f"part-{next(_ids)}"
    await run(store, *bus("state::set", {"scope": first, "key": "k", "value": 1}, call_id))
    with pytest.raises(CallIdReused):
        await run(store, *bus("state::set", {"scope": second, "key": "k", "value": 1}, call_id))
    assert await store.get(second, "k") is None
    again = bus("state::set", {"scope": first, "key": "k", "value": 1}, call_id)
    assert (await run(store, *again)) == (await run(store, *again))  # the record's reply
    assert [e.version for e in await store.events(first)] == [1]
