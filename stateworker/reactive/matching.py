"""Which triggers an event reaches: pure functions over registrations and events.

A registration's filters are compiled once (`Matcher`); the set of all of them is indexed by
scope (`TriggerSet`), so an event meets only the triggers of its own scope plus those with no
scope filter. `match` rules resolve an RFC 6901 pointer in the event document (the handler's
body, events/model.py) and compare as canonical JSON (deep equality, key order ignored, `1`
and `1.0` different: what compare-and-set means by equal), at a cost bounded by the rule's
value, not the event's (`Matcher.rules_hold`). Values are decoded only when a rule of a
candidate trigger needs them. A leased trigger (`ttl_ms`) matches only events written
before its `expires_at`: once expired it is gone at once, before the reaper removes it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import Any

import jsonpointer

from stateworker import codec
from stateworker.clock import rfc3339_ms
from stateworker.events.model import Event, Revision, revision_of
from stateworker.schemas import Trigger
from stateworker.state.query.predicates import MISSING, resolve
from stateworker.state.reactive.trigger_checks import BARRIER
from stateworker.state.reactive.triggers import expires_ms


def document_tree(event: Event) -> dict[str, Any]:
    """The event document as a decoded tree (numbers kept as text), for pointers."""
    return {
        "type": "state", "event_type": event.type, "scope": event.scope, "key": event.key,
        "old_value": codec.decode_exact(bytes(event.old_value)),
        "new_value": codec.decode_exact(bytes(event.new_value)),
        "version": event.version, "revision": event.revision, "ts": rfc3339_ms(event.ts_ms),
        "ts_ms": event.ts_ms, "by": event.by or None,
    }


class Matcher:
    """One registration, compiled."""

    def __init__(self, trigger: Trigger) -> None:
        config = trigger.config
        self.trigger = trigger
        self.scope = config.scope
        self.key = config.key
        self.key_prefix = config.key_prefix
        self.types = None if config.event_types is None else frozenset(config.event_types)
        # (resolved as a query's pointers, RFC 6901 exactly: `-` and `01` name no element;
        # jsonpointer's own resolve answers `-` with an object that no JSON encoder takes)
        self.rules = [(tuple(jsonpointer.JsonPointer(rule.pointer).parts), tree,
                       codec.canonical(tree))
                      for rule in config.match or []
                      for tree in (codec.decode_exact(bytes(rule.equals)),)]
        self.condition = config.condition_function_id
        self.is_barrier = self.condition == BARRIER
        self.asks_the_bus = self.condition is not None and not self.is_barrier  # (slow maybe)
        starts = trigger.start_revisions
        self.starts: dict[int, Revision] | None = None if starts is None else {
            partition: revision_of(revision) for partition, revision in starts.items()}
        self.expires_ms = expires_ms(trigger)  # (None: never)

    def started(self, partition: int, revision: Revision) -> bool:
        """Whether an event of `partition` at `revision` came after the registration."""
        start = None if self.starts is None else self.starts.get(partition)
        return start is None or revision > start

    def filters(self, event: Event) -> bool:
        """The filters that need no value: scope, key, key prefix, event type; and the lease:
        an event written once it expired is not its."""
        return ((self.expires_ms is None or event.ts_ms < self.expires_ms)
                and (self.scope is None or event.scope == self.scope)
                and (self.key is None or event.key == self.key)
                and (self.key_prefix is None or event.key.startswith(self.key_prefix))
                and (self.types is None or event.type in self.types))

    def rules_hold(self, tree: dict[str, Any]) -> bool:
        """Each rule's value equals the one at its pointer, in time bounded by the rule's value
        (at most MAX_EQUALS_BYTES) whatever the size of the event's: the decoded trees are
        compared first (Python's ==, in C: it stops at a length or a key that differs), and
        only a value equal so is encoded, to tell what == does not (`true` from `1`). Encoding
        the value at the pointer for every rule let 1,000 triggers of one caller hold the
        service's loop 1.4 s for each write of a 900 KB value."""
        for parts, wanted, canonical in self.rules:
            found = resolve(tree, parts)
            if found is MISSING or found != wanted or codec.canonical(found) != canonical:
                return False
        return True


def _order(matcher: Matcher) -> bytes:
    return matcher.trigger.id.encode()


class TriggerSet:
    """Every registration, indexed by scope filter; each group in trigger id order. Changed
    in place by `update` (a few registrations reread: reactive/trigger_reads.py); a batch
    asks for the set at each event, and no change lands while one event is matched."""

    def __init__(self, triggers: Iterable[Trigger] = ()) -> None:
        self.by_scope: dict[str, list[Matcher]] = {}
        self.any_scope: list[Matcher] = []
        self.matchers: dict[str, Matcher] = {}  # id -> its matcher
        self._asking = 0  # matchers whose condition is a call over the bus
        for trigger in triggers:
            self._add(Matcher(trigger))

    @property
    def count(self) -> int:
        return len(self.matchers)

    @property
    def ids(self) -> set[str]:
        return set(self.matchers)

    @property
    def asks_the_bus(self) -> bool:
        """Whether a trigger's condition is a call over the bus (slow maybe)."""
        return self._asking > 0

    def triggers(self) -> list[Trigger]:
        return [matcher.trigger for matcher in self.matchers.values()]

    def update(self, changed: dict[str, Trigger | None]) -> None:
        """Each id of `changed` becomes its registration as read (None: gone)."""
        for trigger_id, trigger in changed.items():
            self._remove(trigger_id)
            if trigger is not None:
                self._add(Matcher(trigger))

    def _group(self, matcher: Matcher) -> list[Matcher]:
        if matcher.scope is None:
            return self.any_scope
        return self.by_scope.setdefault(matcher.scope, [])

    def _add(self, matcher: Matcher) -> None:
        self._remove(matcher.trigger.id)  # (an id is registered once)
        self.matchers[matcher.trigger.id] = matcher
        self._asking += matcher.asks_the_bus
        bisect.insort(self._group(matcher), matcher, key=_order)

    def _remove(self, trigger_id: str) -> None:
        matcher = self.matchers.pop(trigger_id, None)
        if matcher is None:
            return
        self._asking -= matcher.asks_the_bus
        group = self._group(matcher)
        del group[bisect.bisect_left(group, _order(matcher), key=_order)]
        if not group and matcher.scope is not None:
            del self.by_scope[matcher.scope]

    def candidates(self, scope: str) -> list[Matcher]:
        scoped = self.by_scope.get(scope)
        if scoped is None:
            return self.any_scope
        return scoped + self.any_scope if self.any_scope else scoped

    def matching(self, event: Event,
                 granted: Callable[[Trigger, str], bool] | None = None,
                 partition: int | None = None) -> list[Matcher]:
        """The triggers whose filters and match rules the event passes (conditions not yet
        evaluated), in trigger id order within each group. `granted(trigger, scope)`: whether
        its owner may still have the event (`acl` mode: a role withdrawn since it registered
        stops it at once). `partition`: the event's, whose stream its revision is of; a
        trigger registered after the event (its start revision there) does not see it."""
        found = []
        tree: dict[str, Any] | None = None
        at = None if partition is None else (partition, revision_of(event.revision))
        for matcher in self.candidates(event.scope):
            if not matcher.filters(event):
                continue
            if at is not None and not matcher.started(*at):
                continue
            if granted is not None and not granted(matcher.trigger, event.scope):
                continue
            if matcher.rules:
                if tree is None:
                    tree = document_tree(event)
                if not matcher.rules_hold(tree):
                    continue
            found.append(matcher)
        return found
