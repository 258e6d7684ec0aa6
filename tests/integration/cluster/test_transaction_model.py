"""Random sequences of transactions, bulk calls (set-many, delete-many) and single calls
(set, delete, update) against a plain Python model, on one server and on the 3+3 cluster: the
same entries, versions and events (type, key, old and new value, version, and which events
share a transaction), step by step."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateworker import StateError, StateStore

pytestmark = pytest.mark.anyio

KEYS = ["a", "b", "c", "d"]
values = st.recursive(
    st.one_of(st.integers(-5, 5), st.sampled_from(["x", "", "é"]), st.none(), st.booleans()),
    lambda inner: st.one_of(st.lists(inner, max_size=2),
                            st.dictionaries(st.sampled_from(["f", "g"]), inner, max_size=2)),
    max_leaves=4)
versions = st.one_of(st.none(), st.integers(0, 3))
keys = st.sampled_from(KEYS)


def tx_op(key: str) -> st.SearchStrategy[dict[str, Any]]:
    with_version = st.integers(0, 3)
    return st.one_of(
        st.builds(lambda v, ev: {"op": "set", "key": key, "value": v,
                                 **({} if ev is None else {"expected_version": ev})},
                  values, versions),
        st.builds(lambda ev: {"op": "delete", "key": key,
                              **({} if not ev else {"expected_version": ev})}, versions),
        st.builds(lambda v: {"op": "update", "key": key, "ops": [
            {"type": "set", "path": "f", "value": v}]}, values),
        st.builds(lambda expected, v: {"op": "compare-and-set", "key": key, "value": v,
                                       **({} if expected is None else {"expected": expected})},
                  st.one_of(st.none(), values), values),
        st.builds(lambda ev: {"op": "check", "key": key, "expected_version": ev}, with_version),
        st.builds(lambda e: {"op": "check", "key": key, "exists": e}, st.booleans()))


transactions = st.lists(keys, min_size=1, max_size=4, unique=True).flatmap(
    lambda ks: st.tuples(*[tx_op(k) for k in ks])).map(
    lambda ops: ("transaction", list(ops)))
set_manys = st.lists(st.tuples(keys, values, versions), min_size=1, max_size=4,
                     unique_by=lambda t: t[0]).map(lambda es: ("set-many", [
                         {"key": k, "value": v, **({} if ev is None else {"expected_version": ev})}
                         for k, v, ev in es]))
delete_manys = st.lists(st.tuples(keys, st.one_of(st.none(), st.integers(1, 3))), min_size=1,
                        max_size=4, unique_by=lambda t: t[0]).map(lambda es: ("delete-many", [
                            {"key": k, **({} if ev is None else {"expected_version": ev})}
                            for k, ev in es]))
singles = st.one_of(
    st.builds(lambda k, v: ("set", {"key": k, "value": v}), keys, values),
    st.builds(lambda k: ("delete", {"key": k}), keys),
    st.builds(lambda k, v: ("update", {"key": k, "ops": [{"type": "set", "path": "g", "value": v}]}),
              keys, values))
commands = st.lists(st.one_of(transactions, set_manys, delete_manys, singles), min_size=1,
                    max_size=10)


class Model:
    """The store as the contract describes it: key -> [value, version]; the events."""

    def __init__(self) -> None:
        self.entries: dict[str, list[Any]] = {}
        self.events: list[tuple[Any, ...]] = []

    def version(self, key: str) -> int:
        return self.entries[key][1] if key in self.entries else 0

    def holds(self, op: dict[str, Any]) -> bool:
        """Whether the op's condition holds now (check, cas, expected_version), and an update
        can apply."""
        key, present = op["key"], op["key"] in self.entries
        if "expected_version" in op and self.version(key) != op["expected_version"]:
            return False
        if op["op"] == "check":
            return "exists" not in op or op["exists"] == present
        if op["op"] == "compare-and-set":
            expected = op.get("expected")
            if expected is None:
                return not present or self.entries[key][0] is None
            return present and self.entries[key][0] == expected and \
                type(self.entries[key][0]) is type(expected)
        if op["op"] == "update":
            return not present or isinstance(self.entries[key][0], dict)
        return True

    def apply(self, op: dict[str, Any], tx: int | None) -> None:
        key = op["key"]
        old = self.entries.get(key, [None])[0]
        kind = op["op"]
        if kind == "check":
            return
        if kind == "delete":
            if key in self.entries:  # (a delete's event carries the deleted version)
                self.events.append(("state:deleted", key, old, None, self.version(key), tx))
                del self.entries[key]
            return
        if kind == "update":
            new = dict(old) if key in self.entries else {}
            for update in op["ops"]:
                new[update["path"]] = update["value"]
        else:
            new = op["value"]
        event = "state:updated" if key in self.entries else "state:created"
        version = self.version(key) + 1
        self.entries[key] = [new, version]
        self.events.append((event, key, old, new, version, tx))

    def run(self, name: str, body: Any, tx: int) -> None:
        if name == "transaction":
            if all(self.holds(op) for op in body):
                for op in body:
                    self.apply(op, tx)
        elif name in ("set-many", "delete-many"):
            kind = "set" if name == "set-many" else "delete"
            for entry in body:
                op = {"op": kind, **entry}
                if self.holds(op):
                    self.apply(op, None)
        elif name == "update":
            if self.holds({"op": "update", **body}):
                self.apply({"op": "update", **body}, None)
        else:
            self.apply({"op": name, **body}, None)


async def run(store: StateStore, scope: str, name: str, body: Any) -> None:
    fn = f"state::{name}"
    request: dict[str, Any] = {"scope": scope}
    if name == "transaction":
        request["ops"] = body
    elif name in ("set-many", "delete-many"):
        request["entries"] = body
    else:
        request.update(body)
    try:
        await store.call(fn, request)
    except StateError as error:
        assert name == "transaction", (name, body, error)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=commands)
async def test_calls_match_the_model(store_on: StateStore, steps: list[tuple[str, Any]]) -> None:
    scope = f"model-{uuid.uuid4().hex[:8]}"
    model = Model()
    for number, (name, body) in enumerate(steps):
        model.run(name, body, number)
        await run(store_on, scope, name, body)
        listed = await store_on.call("state::list-entries", {"scope": scope,
                                                             "include_values": True})
        got = {e["key"]: [e["value"], e["version"]] for e in listed["entries"]}
        assert got == model.entries, (number, name, body)
    events = await store_on.events(scope)
    tx_of: dict[str, int] = {}
    seen = []
    for event in events:
        number = None
        if event.tx is not None:
            number = tx_of.setdefault(event.tx, len(tx_of))
        seen.append((event.type, event.key, json.loads(bytes(event.old_value)),
                     json.loads(bytes(event.new_value)), event.version, number))
    # the model numbers transactions by step; the store's ids are random: compare the grouping
    numbers: dict[int, int] = {}
    wanted = []
    for kind, key, old, new, version, step in model.events:
        group = None if step is None else numbers.setdefault(step, len(numbers))
        wanted.append((kind, key, old, new, version, group))
    assert seen == wanted
