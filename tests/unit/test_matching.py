"""Trigger matching against a plain reference: filters and `match` rules (property tests)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateworker import codec
from stateworker.clock import rfc3339_ms
from stateworker.events.model import Event
from stateworker.reactive.matching import TriggerSet
from stateworker.schemas import MatchRule, Trigger, TriggerConfig
from stateworker.state.reactive.trigger_checks import MAX_OWNER_TRIGGERS

NAMES = st.sampled_from(["", "a", "ab", "b", "job-1", "job-2"])
TYPES = ["state:created", "state:updated", "state:deleted"]
POINTERS = ["/new_value", "/new_value/a", "/new_value/a/b", "/old_value/a", "/key",
            "/new_value/0", "/version", "/missing",
            # RFC 6901: `-` names the element after an array's last (never there), and an
            # index has no leading zero; a string is not an array of its characters
            "/new_value/-", "/new_value/a/-", "/new_value/00", "/new_value/01", "/key/0"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
                    st.sampled_from([1.0, 2.5, -0.5]), st.sampled_from(["", "x", "done", "1"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "0"]), inner,
                                                 max_size=3)), max_leaves=6)


@st.composite
def events(draw: st.DrawFn) -> Event:
    return Event(revision=f"{draw(st.integers(1, 10**6))}-0", type=draw(st.sampled_from(TYPES)),
                 scope=draw(NAMES), key=draw(NAMES),
                 old_value=msgspec.Raw(json.dumps(draw(VALUES)).encode()),
                 new_value=msgspec.Raw(json.dumps(draw(VALUES)).encode()),
                 version=draw(st.integers(1, 3)), ts_ms=1_700_000_000_000, by="")


@st.composite
def triggers(draw: st.DrawFn) -> Trigger:
    rules = draw(st.lists(st.tuples(st.sampled_from(POINTERS), VALUES), max_size=2))
    config = TriggerConfig(
        scope=draw(st.none() | NAMES), key=draw(st.none() | NAMES),
        key_prefix=draw(st.none() | st.sampled_from(["", "job-", "a"])),
        event_types=draw(st.none() | st.lists(st.sampled_from(TYPES), min_size=1,
                                               unique=True)),
        match=[MatchRule(p, msgspec.Raw(json.dumps(v).encode())) for p, v in rules] or None)
    return Trigger(id=f"t{draw(st.integers(0, 10**6))}", function_id="f::g", service="f",
                   config=config, created_at="")


def resolve(doc: Any, pointer: str) -> tuple[bool, Any]:
    for token in pointer.split("/")[1:]:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list) and re.fullmatch("0|[1-9][0-9]*", token) and \
                int(token) < len(doc):
            doc = doc[int(token)]
        else:
            return False, None
    return True, doc


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def reference(trigger: Trigger, event: Event) -> bool:
    config = trigger.config
    doc = {"key": event.key, "version": event.version,
           "old_value": json.loads(bytes(event.old_value)),
           "new_value": json.loads(bytes(event.new_value))}
    if config.scope is not None and config.scope != event.scope:
        return False
    if config.key is not None and config.key != event.key:
        return False
    if config.key_prefix is not None and not event.key.startswith(config.key_prefix):
        return False
    if config.event_types is not None and event.type not in config.event_types:
        return False
    for rule in config.match or []:
        found, value = resolve(doc, rule.pointer)
        if not found or canonical(value) != canonical(json.loads(bytes(rule.equals))):
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.lists(triggers(), max_size=6, unique_by=lambda t: t.id), events())
def test_matching_agrees_with_the_reference(registered: list[Trigger], event: Event) -> None:
    got = {m.trigger.id for m in TriggerSet(registered).matching(event)}
    assert got == {t.id for t in registered if reference(t, event)}


def test_one_and_one_point_zero_differ_and_key_order_does_not_matter() -> None:
    def trigger(equals: bytes) -> Trigger:
        return Trigger(id="t", function_id="f", service="s", created_at="", config=TriggerConfig(
            match=[MatchRule("/new_value", msgspec.Raw(equals))]))

    event = Event(revision="1-0", type="state:created", scope="s", key="k",
                  old_value=msgspec.Raw(b"null"), new_value=msgspec.Raw(b'{"b":1,"a":[1.0]}'),
                  version=1, ts_ms=0, by="")
    assert TriggerSet([trigger(b'{"a":[1.0],"b":1}')]).matching(event)
    assert not TriggerSet([trigger(b'{"a":[1],"b":1}')]).matching(event)
    assert not TriggerSet([trigger(b'{"a":[1.0],"b":true}')]).matching(event)  # (1 == True)


def test_a_large_value_costs_no_more_to_match_than_the_rules_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rule encoded the event's value at its pointer to compare it: one caller's
    1,000 triggers (its share of the registry) on `/new_value` made each write of a 900 KB
    value cost the dispatcher, on the service's loop, 1.4 s. A value that differs from a
    rule's is told apart without encoding it; only one equal to it as a tree is encoded."""
    encoded: list[int] = []
    encode = codec.canonical

    def counted(tree: Any) -> bytes:
        out = encode(tree)
        encoded.append(len(out))
        return out

    rule = MatchRule("/new_value", msgspec.Raw(b'{"big":"no"}'))
    hog = TriggerSet([Trigger(id=f"t{n:04d}", function_id="f::g", service="s", created_at="",
                              owner="hog", config=TriggerConfig(match=[rule]))
                      for n in range(MAX_OWNER_TRIGGERS)])
    value = msgspec.json.encode({"big": "x" * 1_000_000})
    event = Event(revision="1-0", type="state:updated", scope="s", key="k",
                  old_value=msgspec.Raw(b"null"), new_value=msgspec.Raw(value), version=2,
                  ts_ms=0, by="")
    monkeypatch.setattr(codec, "canonical", counted)
    assert hog.matching(event) == []
    assert sum(encoded) < len(value), f"{len(encoded)} encodings of the event's value"
    same = msgspec.Raw(b'{"big":"no"}')
    assert len(hog.matching(Event(revision="1-1", type="state:updated", scope="s", key="k",
                                  old_value=msgspec.Raw(value), new_value=same, version=3,
                                  ts_ms=0, by=""))) == MAX_OWNER_TRIGGERS


def test_a_pointer_to_no_element_matches_nothing() -> None:
    """RFC 6901: `-` is the element after an array's last, which no event holds, and `01` is
    no index; neither matches (nor stops the matching: it once raised, and with it the whole
    partition's dispatch)."""
    def matched(pointer: str) -> bool:
        trigger = Trigger(id="t", function_id="f", service="s", created_at="",
                          config=TriggerConfig(match=[MatchRule(pointer, msgspec.Raw(b"2"))]))
        event = Event(revision="1-0", type="state:created", scope="s", key="k",
                      old_value=msgspec.Raw(b"null"), new_value=msgspec.Raw(b'{"l":[1,2]}'),
                      version=1, ts_ms=0, by="")
        return bool(TriggerSet([trigger]).matching(event))

    assert matched("/new_value/l/1")
    assert not matched("/new_value/l/-")
    assert not matched("/new_value/l/01")
    assert not matched("/new_value/l/2")


def test_a_trigger_sees_only_the_revisions_after_its_start_in_each_partition() -> None:
    """Revisions compare as (ms, sequence) within the event's partition: `10-2` is after
    `9-99` and `10-1`; a partition the trigger has no start for is not held back."""
    trigger = Trigger(id="t", function_id="f", service="s", created_at="",
                      config=TriggerConfig(), start_revisions={0: "10-1", 1: "9-99"})

    def seen(partition: int, revision: str) -> bool:
        event = Event(revision=revision, type="state:created", scope="s", key="k",
                      old_value=msgspec.Raw(b"null"), new_value=msgspec.Raw(b"1"), version=1,
                      ts_ms=0, by="")
        return bool(TriggerSet([trigger]).matching(event, partition=partition))

    assert [seen(0, r) for r in ("9-99", "10-0", "10-1", "10-2", "11-0")] == [
        False, False, False, True, True]
    assert [seen(1, r) for r in ("9-98", "9-99", "9-100", "10-0")] == [False, False, True, True]
    assert seen(2, "1-0")


def test_a_leased_trigger_matches_only_events_written_before_it_expires() -> None:
    expires = 1_700_000_000_000
    leased = Trigger(id="leased", function_id="f::g", service="f", config=TriggerConfig(),
                     created_at="", ttl_ms=1000, expires_at=rfc3339_ms(expires))
    plain = Trigger(id="plain", function_id="f::g", service="f", config=TriggerConfig(),
                    created_at="")
    found = TriggerSet([leased, plain])

    def matched(ts_ms: int) -> list[str]:
        event = Event(revision="1-0", type="state:created", scope="s", key="k",
                      old_value=msgspec.Raw(b"null"), new_value=msgspec.Raw(b"1"), version=1,
                      ts_ms=ts_ms, by="")
        return [m.trigger.id for m in found.matching(event)]

    assert matched(expires - 1) == ["leased", "plain"]
    assert matched(expires) == ["plain"]
    assert matched(expires + 60_000) == ["plain"]
