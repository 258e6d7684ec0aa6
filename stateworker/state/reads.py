"""The read operations of `RedisState`, as plans (a mixin, to keep store.py to its writes).

Reads of one key are one HMGET checked against the clock here; an expired entry reads as
missing before the reaper has deleted it. `list` and `list_keys` are one read-only script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from stateworker import clock
from stateworker.clock import now_ms
from stateworker.errors import NotFound
from stateworker.keys import KeySpace, member
from stateworker.state.schemas import EntryResult, GroupsResult, KeysResult
from stateworker.transport.connection import Arg
from stateworker.transport.plans import Plan, command_reply, then


class ReadPlans:
    """Uses `keys`, `script_plan` and `hash_plan`, which RedisState provides."""

    keys: KeySpace
    script_plan: Callable[[str, Sequence[Arg], Sequence[Arg], Callable[[list[Any]], Any]], Plan]
    hash_plan: Callable[[str, str, int, bytes], Plan]

    def get_plan(self, scope: str, key: str) -> Plan:
        """The stored JSON, or None when missing or expired."""
        entry = self.keys.for_scope(scope).entry(scope, key)

        def finish(replies: list[Any]) -> msgspec.Raw | None:
            value, expires = command_reply(replies[0], "HMGET")
            if value is None or (expires is not None and int(expires) <= now_ms()):
                return None
            return msgspec.Raw(value)

        return Plan([["HMGET", entry, "v", "x"]], finish)

    def get_entry_plan(self, scope: str, key: str, *, default: msgspec.Raw | None = None,
                       required: bool = False) -> Plan:
        entry = self.keys.for_scope(scope).entry(scope, key)

        def finish(replies: list[Any]) -> Any:
            v, n, h, t, c, u, x, b, r = command_reply(replies[0], "HMGET")
            if v is None or (x is not None and int(x) <= now_ms()):
                if required:
                    raise NotFound(f"key {key!r} not found in scope {scope!r}",
                                   {"scope": scope, "key": key})
                return EntryResult(False) if default is None else EntryResult(False, default)

            def result(digest: str) -> EntryResult:
                return EntryResult(
                    True, msgspec.Raw(v), int(n), digest,
                    None if t is None else t.decode(),
                    clock.rfc3339_ms(int(c or 0)) or "", clock.rfc3339_ms(int(u or 0)) or "",
                    None if x is None else clock.rfc3339_ms(int(x)),
                    None if b is None else b.decode(), (r or b"").decode())

            if h is None:  # left unknown by an update: compute and store it now
                return then(self.hash_plan(scope, key, int(n), v), result)
            return result(h.decode())

        return Plan([["HMGET", entry, "v", "n", "h", "t", "c", "u", "x", "b", "r"]], finish)

    def _list_plan(self, scope: str, what: str, finish: Callable[[list[bytes]], Any]) -> Plan:
        part = self.keys.for_scope(scope)
        return self.script_plan("list", [part.key_index(scope)],
                                [now_ms(), part.entry_prefix + member(scope, ""), what],
                                lambda reply: finish(list(reply[1])))

    def list_values_plan(self, scope: str) -> Plan:
        """Live values of a scope in key byte order."""
        return self._list_plan(scope, "values", lambda items: [msgspec.Raw(v) for v in items])

    def list_keys_plan(self, scope: str) -> Plan:
        """Live keys of a scope in byte order."""
        return self._list_plan(scope, "keys", lambda items: KeysResult([k.decode() for k in items]))

    def list_groups_plan(self, hidden: frozenset[str] = frozenset()) -> Plan:
        """Scopes holding at least one entry, byte-sorted, `hidden` ones left out."""
        def finish(replies: list[Any]) -> GroupsResult:
            scopes = {s.decode() for reply in replies for s in command_reply(reply, "ZRANGE")}
            return GroupsResult(sorted(scopes - hidden, key=lambda s: s.encode()))

        return Plan([["ZRANGE", part.scopes, 0, -1] for part in self.keys.all_partitions()],
                    finish)
