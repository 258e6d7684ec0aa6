"""Dagu's state executor actions (`state.get`, `state.set`, `state.delete`, `state.list`,
`state.diff`) over the native state functions.

A call's body is the step's `with:` fields (rules.py: decoded, checked with Dagu's texts,
placed in the native scope `dagu/<scope>/<namespace>`); each action builds the native request
and runs the native function (`state::get-entry`, `set`, `delete`, `list-entries`, `diff`), so
it is validated, written, evented and triggered as the native call is; the result is Dagu's
executor output, field for field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from stateworker.context import CallContext
from stateworker.engines.common import SCOPE_AS_NAMESPACE, raise_as_namespace
from stateworker.engines.dagu import rules, specs
from stateworker.engines.dagu.rules import Place, go_time
from stateworker.engines.dagu.schemas import (
    DaguRequest,
    DeleteOutput,
    DiffOutput,
    GetOutput,
    ListedOutput,
    ListOutput,
    SetOutput,
)
from stateworker.errors import NotFound, StateError
from stateworker.schemas import (
    NULL,
    DeleteRequest,
    DiffRequest,
    DiffResult,
    EntryResult,
    GetEntryRequest,
    ListedEntry,
    ListEntriesRequest,
    ListEntriesResult,
    SetRequest,
    SetResult,
)
from stateworker.specs import Spec
from stateworker.state import functions, typed_functions
from stateworker.state.core.store import RedisState
from stateworker.state.kv.listing import MAX_LIMIT as PAGE_LIMIT
from stateworker.transport.plans import Plan, command_reply, then
from stateworker.transport.wire import Arg


# ---- the actions ---------------------------------------------------------------------------------
def dagu_get(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
    # (Written out rather than composed from `then` and `renamed`: every function call on a
    # Dagu read's path showed in its cost next to the native read's,
    # docs/decisions/0043-engines-thin-translation.md.)
    where, key = rules.address("get", req, ctx, state.settings.max_key_bytes)
    try:
        native = typed_functions.state_get_entry(state, GetEntryRequest(where.native, key), ctx)
    except StateError as exc:
        raise_as_namespace(exc)

    def finish(replies: list[Any]) -> Plan | GetOutput:
        return _get_output(state, req, where, key, native.finish(replies))

    return Plan(native.commands, finish, native.checks_deadline, native.binds_call_id)


def _get_output(state: RedisState, req: DaguRequest, where: Place, key: str,
                entry: EntryResult | Plan) -> Plan | GetOutput:
    """Dagu's output of a get. (A module function: a closure passing itself to `then` would
    be a reference cycle per call: docs/decisions/0044-no-reference-cycles.md.)"""
    if isinstance(entry, Plan):  # (its hash is computed first)
        return then(entry, functools.partial(_get_output, state, req, where, key))
    if entry.found:
        return GetOutput(operation="get", scope=where.scope, namespace=where.namespace,
                         key=key, found=True, version=entry.version, hash=entry.hash,
                         value=entry.value)
    if req.required:  # (it beats default)
        raise NotFound("dag state: not found", {"path": "$.key", "scope": where.scope,
                                                "namespace": where.namespace, "key": key})
    default: Raw | UnsetType = UNSET
    if not isinstance(req.default, UnsetType):  # normalized only when used, as in Dagu
        default = Raw(rules.normalized(state, req.default, "default").json)
    return GetOutput(operation="get", scope=where.scope, namespace=where.namespace, key=key,
                     found=False, value=default)


def dagu_set(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
    where, key = rules.address("set", req, ctx, state.settings.max_key_bytes)
    assert not isinstance(req.value, UnsetType)  # (address checked the configuration)
    value = rules.normalized(state, req.value, "value")
    request = SetRequest(where.native, key, value=Raw(value.json),
                         expected_version=rules.expected_version(req.expected_version),
                         create_only=bool(req.create_only))
    try:
        native = typed_functions.state_set(state, request, ctx, checked=value)
    except StateError as exc:
        raise_as_namespace(exc)

    def answer(result: SetResult) -> SetOutput:
        return SetOutput(operation="set", scope=where.scope, namespace=where.namespace, key=key,
                         version=result.version, hash=result.hash, created=result.version == 1)

    return rules.in_dagu_texts(native, answer)


def dagu_delete(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
    """Native delete answers the old value, `null` both for a missing key and a stored
    `null`; an EXISTS just before it (same pipeline) tells the two apart. `expected_version`
    deletes only the entry at that version, as set's does (a stale one is `dag state:
    conflict`; `0`, Dagu's version of a missing key, deletes nothing and conflicts with an
    entry that exists)."""
    where, key = rules.address("delete", req, ctx, state.settings.max_key_bytes)
    expected = rules.expected_version(req.expected_version)
    if expected == 0:
        return _absent(state, where, key, ctx)
    with SCOPE_AS_NAMESPACE:
        delete = typed_functions.state_delete(
            state, DeleteRequest(where.native, key, expected_version=expected), ctx)
    exists: list[Arg] = ["EXISTS", state.keys.for_scope(where.native).entry(where.native, key)]

    def finish(replies: list[Any]) -> DeleteOutput:
        found = command_reply(replies[0], "EXISTS") == 1
        try:
            old = delete.finish(replies[1:])
        except StateError as exc:
            rules.raise_in_dagu_terms(exc)
        return DeleteOutput(operation="delete", scope=where.scope, namespace=where.namespace,
                            key=key, deleted=bytes(old) != bytes(NULL) or found)

    return Plan([exists, *delete.commands], finish, delete.checks_deadline, delete.binds_call_id)


def _absent(state: RedisState, where: Place, key: str, ctx: CallContext) -> Plan:
    """delete with `expected_version: 0`: the key must be missing, so nothing is deleted."""
    def answer(entry: EntryResult) -> DeleteOutput:
        if entry.found:
            raise rules.conflict({"expected_version": 0, "current_version": entry.version})
        return DeleteOutput(operation="delete", scope=where.scope, namespace=where.namespace,
                            key=key, deleted=False)

    with SCOPE_AS_NAMESPACE:
        plan = typed_functions.state_get_entry(state, GetEntryRequest(where.native, key), ctx)
    return then(plan, answer)


def dagu_list(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
    """Every entry of the namespace (with the prefix), in key byte order, up to `limit`
    (0: all), read in native pages of at most PAGE_LIMIT."""
    rules.configuration("list", req)
    where = rules.place(req, ctx, state.settings.max_key_bytes)
    return _Listing(state, req, ctx, where, rules.list_limit(req), rules.list_prefix(req)
                    ).page(None)


class _Listing:
    """One list, page after page. (A class: two closures calling each other would be a
    reference cycle per list, state/kv/writes.py `_write_attempt`.)"""

    def __init__(self, state: RedisState, req: DaguRequest, ctx: CallContext, where: Place,
                 limit: int, prefix: str) -> None:
        self.state, self.req, self.ctx, self.where = state, req, ctx, where
        self.limit, self.prefix = limit, prefix
        self.entries: list[ListedOutput] = []

    def page(self, after: str | None) -> Plan:
        limit = self.limit
        wanted = PAGE_LIMIT if limit == 0 else min(PAGE_LIMIT, limit - len(self.entries))
        native = ListEntriesRequest(scope=self.where.native, prefix=self.prefix or None,
                                    limit=wanted, after=after,
                                    include_values=bool(self.req.include_values))
        with SCOPE_AS_NAMESPACE:
            return then(typed_functions.state_list_entries(self.state, native, self.ctx),
                        self.collect)

    def collect(self, result: ListEntriesResult) -> Plan | ListOutput:
        where, limit, entries = self.where, self.limit, self.entries
        entries.extend(_listed(where, entry) for entry in result.entries)
        if isinstance(result.next_after, str) and (limit == 0 or len(entries) < limit):
            return self.page(result.next_after)
        return ListOutput(operation="list", scope=where.scope, namespace=where.namespace,
                          prefix=self.prefix, entries=entries)


def _listed(where: Place, entry: ListedEntry) -> ListedOutput:
    return ListedOutput(scope=where.scope, namespace=where.namespace, key=entry.key,
                        version=entry.version, hash=entry.hash,
                        created_at=go_time(entry.created_at),
                        updated_at=go_time(entry.updated_at), value=entry.value)


def dagu_diff(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
    """Compare the value with the stored one by hash; when it changed (or is new) and
    `update` is not false, write it as native `state::diff` does (one script: compare and
    write, so no writer gets between them)."""
    where, key = rules.address("diff", req, ctx, state.settings.max_key_bytes)
    assert not isinstance(req.value, UnsetType)  # (address checked the configuration)
    current = rules.normalized(state, req.value, "value")
    expected = rules.expected_version(req.expected_version)
    output = DiffOutput(operation="diff", scope=where.scope, namespace=where.namespace,
                        key=key, changed=True, found_previous=False, current=Raw(current.json))
    if req.update is False:
        return _compare(state, where, key, current.hash, expected, output, ctx)

    def answer(diff: DiffResult) -> DiffOutput:
        return msgspec.structs.replace(
            output, changed=diff.changed, found_previous=diff.found_previous,
            previous_version=diff.previous_version or 0, version=diff.version or 0,
            hash=diff.hash or "", previous=diff.previous)

    native = DiffRequest(where.native, key, value=Raw(current.json), update=True,
                         expected_version=expected)
    with SCOPE_AS_NAMESPACE:
        return rules.in_dagu_texts(typed_functions.state_diff(state, native, ctx, checked=current),
                                   answer)


def _compare(state: RedisState, where: Place, key: str, digest: str, expected: int | None,
             output: DiffOutput, ctx: CallContext) -> Plan:
    """`update: false`: nothing is written; version and hash describe the stored entry."""
    def answer(entry: EntryResult) -> DiffOutput:
        stored = entry.version if isinstance(entry.version, int) else 0
        if expected is not None and expected != stored:  # (a missing key is version 0)
            raise rules.conflict({"expected_version": expected, "current_version": stored})
        if not entry.found:
            return output
        return msgspec.structs.replace(
            output, changed=entry.hash != digest, found_previous=True, previous_version=stored,
            version=stored, hash=entry.hash or "", previous=entry.value)

    with SCOPE_AS_NAMESPACE:
        plan = typed_functions.state_get_entry(state, GetEntryRequest(where.native, key), ctx)
    return then(plan, answer)


def served(spec: Spec, action: Callable[[RedisState, DaguRequest, CallContext], Plan]
           ) -> functions.Served:
    """`spec`'s action, on a JSON body or a request Struct; its errors in Dagu's terms (an
    action whose plan may end in CONFLICT or VALUE_TOO_LARGE says them in Dagu's terms itself:
    rules.in_dagu_texts)."""
    def typed(state: RedisState, req: DaguRequest, ctx: CallContext) -> Plan:
        try:
            return action(state, req, ctx)
        except StateError as exc:
            rules.raise_in_dagu_terms(exc)

    def prepare_call(state: RedisState, body: bytes, ctx: CallContext) -> Plan:
        try:
            return action(state, rules.decode(body), ctx)
        except StateError as exc:
            rules.raise_in_dagu_terms(exc)

    return functions.Served(spec, typed, prepare_call)


SERVED: tuple[functions.Served, ...] = (
    served(specs.GET, dagu_get),
    served(specs.SET, dagu_set),
    served(specs.DELETE, dagu_delete),
    served(specs.LIST, dagu_list),
    served(specs.DIFF, dagu_diff),
)
