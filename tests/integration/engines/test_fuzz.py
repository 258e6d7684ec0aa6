"""Nothing a caller sends to an engine's front-end can break it: hypothesis draws bodies of the
engines' own field names with values of every JSON type (and texts that hit their rules: NUL,
`/`, `:secret`, `*`, very long ones) and contexts of every shape; each call ends in its result
or in an error with a stable code and a message, never in INTERNAL or an exception of Python's.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from stateworker import StateStore
from stateworker.context import CallContext
from stateworker.engines import dagu, moco
from stateworker.engines.catalog import CATALOG
from stateworker.errors import ERROR_CLASSES, StateError
from stateworker.state import functions

pytestmark = pytest.mark.anyio

NAMES = st.text("abck-_.:/", min_size=1, max_size=6)  # mostly names a rule lets through
TEXTS = st.one_of(
    NAMES, NAMES, NAMES,
    st.sampled_from(["", " ", "k", "secret", "bob:secret", "a/b", "/k", "k/", "a//b", ".", "..",
                     "\\", "*", "t*", "%_?", "dag", "root_dag", "global", "custom", "workflow",
                     "key", "last_update_time", "topic", "asc", "desc", "\0", "k\0", "é:x",
                     "x" * 1100, "  padded  ", "3", "-1"]),
    st.text(max_size=12),
)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), TEXTS)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(TEXTS, inner, max_size=3)), max_leaves=6)
COUNTS = st.one_of(st.integers(-3, 3), st.integers(-2**40, 2**40), st.sampled_from([0, 1, 2000]))
KINDS: dict[str, st.SearchStrategy[Any]] = {  # each field's usual type (a wrong one at times)
    "text": TEXTS, "bool": st.booleans(), "count": COUNTS, "value": VALUES,
    "order_by": st.sampled_from(["key", "last_update_time", "topic", "updated_at", "x"]),
    "order": st.sampled_from(["asc", "desc", "up"]),
    "scope": st.sampled_from(["dag", "root_dag", "global", "custom", " global ", "other"]),
    "version": st.one_of(COUNTS, st.sampled_from(["3", "-1", "x", "${V}", " 2"])),
    "ops": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["set", "increment", "x"]),
                                           "path": TEXTS, "value": VALUES, "by": COUNTS}),
                    max_size=2),
}
MOCO = {"namespace": "text", "key": "text", "value": "value", "topic": "text",
        "in_global_ns": "bool", "key_pattern": "text", "topic_pattern": "text",
        "limit": "count", "offset": "count", "order_by": "order_by",
        "order_direction": "order", "name_pattern": "text"}
DAGU = {"scope": "scope", "namespace": "text", "key": "text", "prefix": "text",
        "value": "value", "default": "value", "expected_version": "version",
        "create_only": "bool", "required": "bool", "update": "bool", "limit": "count",
        "include_values": "bool"}
NATIVE = {"isolation": "text", "scope": "text", "key": "text", "value": "value",
          "max_keys": "count", "expected_version": "count", "ops": "ops", "limit": "count"}
FIELDS = {**{spec.name: {f.name: MOCO[f.name] for f in msgspec.structs.fields(spec.request)}
             for spec in moco.SPECS},
          **{spec.name: DAGU for spec in dagu.SPECS},
          **{fn: NATIVE for fn in ("state::set", "state::get-entry", "state::list-entries",
                                   "state::update")}}


@st.composite
def bodies(draw: st.DrawFn, fn: str) -> dict[str, Any]:
    """Mostly the function's own fields with their usual types; now and then a wrong type
    or another field."""
    body = {}
    for name, usual in FIELDS[fn].items():
        if draw(st.integers(0, 9)) < (8 if name in ("namespace", "key", "value") else 3):
            body[name] = draw(KINDS[usual if draw(st.integers(0, 9)) else "value"])
    if not draw(st.integers(0, 19)):
        body[draw(TEXTS)] = draw(VALUES)
    return body


CONTEXTS = st.dictionaries(
    st.sampled_from(["user_id", "dag_name", "root_dag_name", "org_id", "workflow_id",
                     "execution_id"]),
    st.one_of(TEXTS, TEXTS, TEXTS, st.integers(), st.none(), st.lists(TEXTS, max_size=2)),
    max_size=6)
CALLS = st.sampled_from(sorted(FIELDS)).flatmap(lambda fn: st.tuples(st.just(fn), bodies(fn)))


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(call=CALLS, context=CONTEXTS)
async def test_any_body_and_context_end_in_a_result_or_a_coded_error(
        store: StateStore, call: tuple[str, dict[str, Any]], context: dict[str, Any]) -> None:
    fn, body = call
    ctx = CallContext(context=context, caller="fuzz")
    try:
        plan = functions.prepare(store.state, fn, msgspec.json.encode(body), ctx, CATALOG)
        result = await store.state.execute(plan)
    except StateError as exc:
        assert exc.code in ERROR_CLASSES and exc.code != "INTERNAL", (fn, body, context, exc)
        assert exc.message
        event(f"{fn}: {exc.code}")
        return
    msgspec.json.encode(result)  # (what the bus would send: it encodes)
    event(f"{fn}: ok")
