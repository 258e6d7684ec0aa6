"""state::get-many and state::delete-by-prefix through both typed faces (StateStore in process,
StateClient over the bus): the generated methods, tagged types, `typed` with the Structs, and a
refusal's code and path as the caller sees it."""

from __future__ import annotations

import datetime

import msgspec
import pytest

from stateworker import StateClient, StateError, StateStore, specs
from stateworker.schemas import DeleteByPrefixRequest, GetManyRequest

pytestmark = pytest.mark.anyio


async def test_both_faces(store: StateStore, client: StateClient, scope: str) -> None:
    when = datetime.date(2026, 12, 3)
    for face, key in ((store, "in-process"), (client, "bus")):
        await face.set(scope, f"{key}/a", {"on": when}, topic="t")
        await face.set(scope, f"{key}/b", 2)
        entries = await face.get_many(scope, [f"{key}/b", "none", f"{key}/a"])
        assert [e.get("value") for e in entries] == [2, None, {"on": when}]
        assert entries[2]["topic"] == "t" and entries[1] == {"found": False}
        assert entries[0] == await face.call("state::get-entry", {"scope": scope,
                                                                  "key": f"{key}/b"})
        typed = await face.typed(specs.GET_MANY, GetManyRequest(scope, [f"{key}/b"]))
        assert [(e.found, e.version, bytes(e.value)) for e in typed.entries] == [(True, 1, b"2")]
        assert await face.delete_by_prefix(scope, f"{key}/", limit=1) == {"deleted": 1,
                                                                         "more": True}
        done = await face.typed(specs.DELETE_BY_PREFIX,
                                DeleteByPrefixRequest(scope=scope, prefix=f"{key}/"))
        assert (done.deleted, done.more) == (1, False)
        with pytest.raises(StateError) as caught:
            await face.delete_by_prefix(scope, "")
        assert (caught.value.code, caught.value.details["path"]) == ("INVALID_REQUEST",
                                                                     "$.prefix")
        with pytest.raises(StateError) as caught:
            await face.get_many(scope, ["k"] * 1001)
        assert (caught.value.code, caught.value.details["limit"]) == ("INVALID_REQUEST", 1000)
    assert await store.list_keys(scope) == []
    assert msgspec.json.decode(await client.call_json(
        "state::get-many", b'{"scope":"%s","keys":[]}' % scope.encode())) == {"entries": []}
