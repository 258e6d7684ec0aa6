"""Error messages show values as JSON, never as Python reprs (issue 21, defect 7): the bad
inputs a caller sends (a scope `null`, a key `null`, a non-string function id, a missing body
field, a reserved scope, a bad context ...), in-process and over the bus, come back with
messages that say `null`, `true`, `"text"`, never `None`, `True`, `'text'` or `{'a': 1}`."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
import redis.asyncio as aredis

from stateworker import StateStore
from stateworker.app.service import StateService
from stateworker.errors import StateError
from tests.integration.busproto import roundtrip

pytestmark = pytest.mark.anyio

TRIGGER = {"id": "t", "function_id": "svc::on_change", "service": "svc"}

# (function id, body, context): every one is refused.
BAD: list[tuple[str, Any, dict[str, Any] | None]] = [
    ("state::get", {"scope": None, "key": "k"}, None),
    ("state::get", {"scope": "orders", "key": None}, None),
    ("state::get", {"scope": "orders"}, None),
    ("state::set", {"scope": "orders", "key": "k"}, None),
    ("state::set", {"scope": True, "key": "k", "value": 1}, None),
    ("state::set", {"scope": {"a": None}, "key": "k", "value": 1}, None),
    ("state::set", {"scope": "orders", "key": "k", "value": 1, "ttl_ms": False}, None),
    ("state::set", {"scope": "state_barrier", "key": "k", "value": 1}, None),
    ("state::update", {"scope": "orders", "key": "k", "ops": [None]}, None),
    ("state::update", {"scope": "orders", "key": "k", "ops": [{"type": "set", "path": None}]},
     None),
    ("state::register-trigger", {**TRIGGER, "function_id": 5, "scope": "orders"}, None),
    ("state::register-trigger", {**TRIGGER, "function_id": None}, None),
    ("state::register-trigger", {**TRIGGER, "config": {"scope": "orders",
                                                       "event_types": ["bogus"]}}, None),
    ("state::register-trigger", {**TRIGGER, "config": {"scope": "state_triggers"}}, None),
    ("state::claim-namespace", {"functions_prefix": None, "scopes": ["x"]}, None),
    ("state::list-entries", {"scope": "orders", "limit": None}, None),
    ("no::such-function", {}, None),
    ("state::get", [None, True], None),
    ("builtin.state.set_state", {"namespace": "n", "key": "k", "value": 1},
     {"user_id": None}),
    ("builtin.state.set_state", {"namespace": "n", "key": "k", "value": 1},
     {"user_id": True}),
    ("state::set", {"isolation": "workflow", "key": "k", "value": 1},
     {"org_id": None, "workflow_id": "w"}),
]

REPR = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|\{'|(?:^|[\s(\[{:=,])'")


def assert_json_only(message: str) -> None:
    assert not REPR.search(message), f"a Python repr in the message: {message}"


async def test_messages_in_process_show_json_values(store: StateStore) -> None:
    for fn, body, context in BAD:
        with pytest.raises(StateError) as caught:
            await store.call(fn, body, context=context)
        assert_json_only(caught.value.message)


async def test_messages_over_the_bus_show_json_values(service: StateService,
                                                      raw: aredis.Redis, prefix: str) -> None:
    calls: list[tuple[str, Any, dict[str, Any]]] = [
        (fn, body, {} if context is None else {"context": msgspec.json.encode(context)})
        for fn, body, context in BAD]
    # The entry's own fields: a deadline that is not a number, a context that is no object.
    calls += [("state::get", {"scope": "orders", "key": "k"}, {"deadline_ms": "soon"}),
              ("state::get", {"scope": "orders", "key": "k"}, {"deadline_ms": b"\xff'x'"}),
              ("state::get", {"scope": "orders", "key": "k"}, {"context": "[null, true]"})]
    for fn, body, extra in calls:
        document = await roundtrip(raw, prefix, fn, body, **extra)
        assert document["ok"] is False, document
        assert_json_only(document["error"]["message"])
