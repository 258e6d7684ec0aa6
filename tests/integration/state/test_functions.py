"""The state::* functions as a whole (state/functions.py) against real Redis: a body must be
a JSON object, an unknown function is UNKNOWN_FUNCTION, and every function refuses a reserved
scope (unknown fields: tests/integration/bus/test_field_errors.py)."""

from __future__ import annotations

import pytest

from stateworker import StateStore
from stateworker.specs import NATIVE
from tests.calls import error_of

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("fn", ["state::get", "state::set", "state::delete", "state::list",
                                "state::list_keys", "state::compare-and-set",
                                "state::get-entry"])
async def test_reserved_scope_rejected(store: StateStore, fn: str) -> None:
    body = {"scope": "state_barrier", "key": "k", "value": 1}
    fields = next(spec.fields for spec in NATIVE if spec.name == fn)
    err = await error_of(store, fn, {k: v for k, v in body.items() if k in fields})
    assert err.code == "RESERVED_SCOPE" and "state_barrier" in err.message


async def test_body_must_be_an_object(store: StateStore) -> None:
    for body in (b"[]", b"1", b"not json", b""):
        err = await error_of(store, "state::get", body)
        assert err.code == "INVALID_REQUEST" and err.details["path"] == "$"


async def test_unknown_function(store: StateStore) -> None:
    err = await error_of(store, "state::nope", {})
    assert err.code == "UNKNOWN_FUNCTION" and "state::nope" in err.message
