"""The state::* functions as a whole (state/functions.py) against real Redis: a body must be
a JSON object, unknown fields are ignored, an unknown function is UNKNOWN_FUNCTION, and every
function refuses a reserved scope."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from tests.calls import error_of

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("fn", ["state::get", "state::set", "state::delete", "state::list",
                                "state::list_keys", "state::compare-and-set",
                                "state::get-entry"])
async def test_reserved_scope_rejected(store: StateStore, fn: str) -> None:
    err = await error_of(store, fn, {"scope": "state_barrier", "key": "k", "value": 1})
    assert err.code == "RESERVED_SCOPE" and "state_barrier" in err.message


async def test_body_must_be_an_object(store: StateStore) -> None:
    for body in (b"[]", b"1", b"not json", b""):
        err = await error_of(store, "state::get", body)
        assert err.code == "INVALID_REQUEST" and err.details["path"] == "$"


async def test_unknown_fields_ignored_and_unknown_function(store: StateStore, scope: str) -> None:
    await store.call("state::set", {"scope": scope, "key": "k", "value": 1, "extra": [1]})
    err = await error_of(store, "state::nope", {})
    assert err.code == "UNKNOWN_FUNCTION" and "state::nope" in err.message
