"""moco's State Store Activities (`builtin.state.*`) over the native state functions.

Each activity resolves its namespace (rules.resolve: the native scope), builds the
native request and calls the native function, so it is checked, written, evented and
triggered exactly as that call; only its result is reshaped to moco's. docs/moco.md is the
user's guide.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec

from stateworker import schemas
from stateworker.context import CallContext
from stateworker.engines.common import SCOPE_AS_NAMESPACE, raise_as_namespace, renamed
from stateworker.engines.moco import rules, specs
from stateworker.engines.moco import schemas as moco
from stateworker.errors import StateError
from stateworker.patterns import glob_match, glob_parts
from stateworker.schemas import (
    NULL,
    DeletedResult,
    EntryResult,
    GroupsResult,
    ListEntriesRequest,
    ListEntriesResult,
)
from stateworker.specs import Spec
from stateworker.state import functions, typed_functions
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import listing
from stateworker.transport.plans import Plan, then

R = TypeVar("R", bound=msgspec.Struct)
# moco's order_by -> native list-entries' (whose index of update times is `updated_at`)
ORDER_BY: dict[str, Literal["key", "updated_at", "topic"]] = {
    "key": "key", "last_update_time": "updated_at", "topic": "topic"}


def _null(_result: Any) -> msgspec.Raw:
    return NULL


def answered_null(plan: Plan) -> Plan:
    """`plan`, answered `null` when it ends (moco's writes return None): `then(plan, _null)`
    with two calls fewer, on the path of every set_state."""
    def finish(replies: list[Any]) -> Any:
        out = plan.finish(replies)
        return then(out, _null) if isinstance(out, Plan) else NULL

    return Plan(plan.commands, finish, plan.checks_deadline, plan.binds_call_id)


# (set_state and get_state, the common calls, name the native errors without a `with`: it
# costs two calls more on their path, docs/decisions/0043-engines-thin-translation.md.)
def set_state(state: RedisState, req: moco.SetStateRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    try:
        # topic None clears an earlier tag: moco's set_state always writes the topic column.
        plan = typed_functions.state_set(state, schemas.SetRequest(
            scope, req.key, value=req.value, topic=req.topic), ctx)
    except StateError as exc:
        raise_as_namespace(exc)
    return answered_null(plan)


def get_state(state: RedisState, req: moco.KeyRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    try:
        return typed_functions.state_get(state, schemas.GetRequest(scope, req.key), ctx)
    except StateError as exc:
        raise_as_namespace(exc)


def iso_utc(rfc3339: str) -> str:
    """`...T15:04:05.123Z` -> `...T15:04:05.123+00:00`: Python's datetime.fromisoformat reads
    the `Z` only from 3.11 on; moco's own example parses last_update_time with it."""
    return rfc3339.removesuffix("Z") + "+00:00"


def get_state_with_ts(state: RedisState, req: moco.KeyRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    with SCOPE_AS_NAMESPACE:
        plan = typed_functions.state_get_entry(state, schemas.GetEntryRequest(scope, req.key), ctx)

    def reshape(entry: EntryResult) -> moco.StateWithTs:
        if not entry.found or not isinstance(entry.updated_at, str):
            return moco.StateWithTs(NULL, None)
        assert isinstance(entry.value, msgspec.Raw)
        return moco.StateWithTs(entry.value, iso_utc(entry.updated_at))

    return then(plan, reshape)


def del_state(state: RedisState, req: moco.KeyRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    with SCOPE_AS_NAMESPACE:
        plan = typed_functions.state_delete(state, schemas.DeleteRequest(scope, req.key), ctx)
    return answered_null(plan)


def update_topic(state: RedisState, req: moco.UpdateTopicRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    with SCOPE_AS_NAMESPACE:
        # A missing key: native update-topic answers {updated: false} and writes nothing.
        plan = typed_functions.state_update_topic(
            state, schemas.UpdateTopicRequest(scope, req.key, req.topic), ctx)
    return answered_null(plan)


def delete_by_topic(state: RedisState, req: moco.DeleteByTopicRequest, ctx: CallContext) -> Plan:
    scope = rules.resolve(state.settings, ctx, req)
    with SCOPE_AS_NAMESPACE, renamed("topic", "topic_pattern"):
        plan = typed_functions.state_delete_by_topic(
            state, schemas.DeleteByTopicRequest(scope, req.topic_pattern), ctx)

    def deleted(result: DeletedResult) -> int:
        return result.deleted

    return then(plan, deleted)


def list_states(state: RedisState, req: moco.ListStatesRequest, ctx: CallContext) -> Plan:
    """Pages of native list-entries (at most listing.MAX_LIMIT rows each, walked with its
    `next_after` cursor) until `limit` rows, or every row when it is null."""
    scope = rules.resolve(state.settings, ctx, req)
    wanted, offset = rules.count("limit", req.limit), rules.count("offset", req.offset)
    validate.pattern("key_pattern", req.key_pattern)  # (before the prefix taken from it)
    native = ListEntriesRequest(
        scope=scope, prefix=literal_start(req.key_pattern), key_pattern=req.key_pattern,
        topic_pattern=req.topic_pattern, order_by=ORDER_BY[req.order_by],
        order=req.order_direction, limit=page_limit(wanted), offset=offset or 0)
    return _StatesListing(state, ctx, wanted).pages(native)


class _StatesListing:
    """One list_states, page after page. (A class: closures calling each other would be a
    reference cycle per list, state/kv/writes.py `_write_attempt`.)"""

    def __init__(self, state: RedisState, ctx: CallContext, wanted: int | None) -> None:
        self.state, self.ctx, self.wanted = state, ctx, wanted
        self.rows: list[moco.StateRow] = []

    def pages(self, page_req: ListEntriesRequest) -> Plan:
        with SCOPE_AS_NAMESPACE:
            plan = typed_functions.state_list_entries(self.state, page_req, self.ctx)
        return then(plan, functools.partial(self.more, page_req))

    def more(self, page_req: ListEntriesRequest, page: ListEntriesResult
             ) -> list[moco.StateRow] | Plan:
        rows, wanted = self.rows, self.wanted
        rows.extend(moco.StateRow(entry.key, entry.topic) for entry in page.entries)
        if wanted == 0:  # (the page of 1 only checked the request)
            return []
        left = None if wanted is None else wanted - len(rows)
        if isinstance(page.next_after, msgspec.UnsetType) or left == 0:
            return rows
        return self.pages(msgspec.structs.replace(page_req, after=page.next_after,
                                                  limit=page_limit(left)))


def page_limit(left: int | None) -> int:
    """The native page size for `left` rows still wanted (None: all); at least 1, which the
    native check requires (a limit of 0 still reads one page, to check the request)."""
    return listing.MAX_LIMIT if left is None else max(1, min(left, listing.MAX_LIMIT))


def literal_start(pattern: str | None) -> str | None:
    """What every key a `*` pattern matches starts with: as the native `prefix`, a list in key
    order starts there in O(log n) and stops past it, instead of walking the whole index."""
    if not pattern:
        return None
    return pattern.split("*", 1)[0] or None


def list_namespaces(state: RedisState, req: moco.ListNamespacesRequest, ctx: CallContext) -> Plan:
    """Native list_groups (every scope holding an entry, reserved and claimed ones left out;
    list-namespaces is the same read, cut at 1000 with no cursor), then moco's filters."""
    limit = rules.count("limit", req.limit)
    validate.pattern("name_pattern", req.name_pattern)
    own = None if req.in_global_ns else rules.user_id(ctx) + ":"
    parts = None if req.name_pattern is None else glob_parts(req.name_pattern)

    def names(groups: GroupsResult) -> list[str]:
        found = []
        for scope in groups.groups:
            if rules.is_secret(scope):
                continue
            if own is None:
                name = scope if ":" not in scope else None  # a user's scope always has one
            else:
                name = scope[len(own):] if scope.startswith(own) else None
            if name is not None and (parts is None or glob_match(name, parts)):
                found.append(name)
        return found if limit is None else found[:limit]

    plan = typed_functions.state_list_groups(state, schemas.EmptyRequest(), ctx)
    return then(plan, names)


def served(spec: Spec, function: Callable[[RedisState, R, CallContext], Plan]
           ) -> functions.Served:
    """`spec`'s activity: `function` on a JSON body decoded as its request (rules.request)."""
    fn, request_type = spec.name, spec.request
    decoder = msgspec.json.Decoder(request_type)

    def prepare_call(state: RedisState, body: bytes, ctx: CallContext) -> Plan:
        try:
            req = decoder.decode(body)  # (a well-formed body: one C call)
        except (msgspec.DecodeError, RecursionError):
            req = rules.request(fn, body, request_type)  # (raises, naming the field)
        return function(state, req, ctx)

    return functions.Served(spec, function, prepare_call)


SERVED: tuple[functions.Served, ...] = (
    served(specs.SET_STATE, set_state),
    served(specs.GET_STATE, get_state),
    served(specs.GET_STATE_WITH_TS, get_state_with_ts),
    served(specs.DEL_STATE, del_state),
    served(specs.LIST_STATES, list_states),
    served(specs.LIST_NAMESPACES, list_namespaces),
    served(specs.UPDATE_TOPIC, update_topic),
    served(specs.DELETE_BY_TOPIC, delete_by_topic),
)
