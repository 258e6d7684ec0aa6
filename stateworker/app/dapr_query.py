"""Dapr's state query (`/v1.0-alpha1/state/<store>/query`) as native `state::query` calls.

A filter of EQ, NEQ, GT, GTE, LT, LTE and IN on a dotted path, joined by AND and OR. Without
OR and `sort` it is one native query, paged by the native cursor (indexes serve it). With
either, the matches of each AND branch are gathered (at most MAX_GATHERED entries in all,
and values of at most `max_call_bytes` read, as one native call reads: beyond either, the
query is refused naming the limit, never cut short), joined by key, sorted (each
`sort` key ASC or DESC, values in the native query's order: null, false, true, numbers, strings;
a missing or non-scalar value last), and paged by offset (the token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec

from stateworker.app.dapr_fields import Fields
from stateworker.app.dapr_requests import DaprError, malformed
from stateworker.codec import whole_number
from stateworker.error_codes import http_status
from stateworker.errors import CallTooLarge, InvalidRequest, StateError, shown
from stateworker.state.query import predicates

MAX_BRANCHES = 16  # AND branches of a filter with OR (its disjunctive form)
MAX_GATHERED = 10_000  # entries a query with OR or sort may gather before it pages
GATHER_PAGE = 1000  # entries per native call while gathering
OPS = {"EQ": "eq", "NEQ": "ne", "GT": "gt", "GTE": "gte", "LT": "lt", "LTE": "lte", "IN": "in"}

# a native query body and the Dapr fields it names -> its page
Native = Callable[[dict[str, Any], Fields], Awaitable["Found"]]


class Sort(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    order: Literal["ASC", "DESC"] = "ASC"


class Page(msgspec.Struct, forbid_unknown_fields=True):
    limit: int = 100
    token: str | None = None


class Query(msgspec.Struct, forbid_unknown_fields=True):
    filter: dict[str, Any] = msgspec.field(default_factory=dict)
    sort: list[Sort] = msgspec.field(default_factory=list)
    page: Page = msgspec.field(default_factory=Page)


class Entry(msgspec.Struct):
    key: str = ""
    value: msgspec.Raw = msgspec.Raw(b"null")
    version: int | None = None
    expires_at: str | None = None


class Found(msgspec.Struct):
    entries: list[Entry]
    next_after: str | None = None


def pointer(path: str) -> str:
    """A dotted Dapr path as a JSON pointer."""
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path.split("."))


def branches(node: Any, where: str = "$.filter") -> list[list[dict[str, Any]]]:
    """The filter in disjunctive form: a list of AND branches, each a native `where` whose
    conditions hold their Dapr field (`at`, taken out before the call: `_native`)."""
    if not isinstance(node, dict):
        raise malformed(f"{where}: must be an object (EQ, NEQ, GT, GTE, LT, LTE, IN, AND, OR)")
    if not node:
        return [[{"pointer": "", "op": "exists", "value": True, "at": where}]]
    if len(node) != 1:
        raise malformed(f"{where}: one operator per object, got {sorted(node)}")
    (kind, arg), = node.items()
    if kind in ("AND", "OR"):
        if not isinstance(arg, list) or not arg:
            raise malformed(f"{where}.{kind}: a non-empty list of filters")
        parts = [branches(part, f"{where}.{kind}[{i}]") for i, part in enumerate(arg)]
        if kind == "OR":
            joined = [b for part in parts for b in part]
        else:
            joined = [[]]
            for part in parts:
                joined = [a + b for a in joined for b in part]
                if len(joined) > MAX_BRANCHES:
                    break
        if len(joined) > MAX_BRANCHES:
            raise malformed(f"{where}: at most {MAX_BRANCHES} AND branches once the ORs are "
                            f"spread out, got more")
        return joined
    if kind in OPS and isinstance(arg, dict) and len(arg) == 1:
        (path, value), = arg.items()
        if kind == "IN" and not isinstance(value, list):
            raise malformed(f"{where}.IN: a list of values")
        return [[{"pointer": pointer(str(path)), "op": OPS[kind], "value": value,
                  "at": f"{where}.{kind}[{shown(str(path))}]"}]]
    raise malformed(f"{where}: {shown(kind)} with {shown(arg)}: want one of "
                    f"{', '.join(OPS)} (one path each), AND or OR")


async def run(query: Query, native: Native, scope: str, max_call_bytes: int
              ) -> tuple[list[Entry], str | None]:
    """The page of `query` over `scope`: its entries and the next page's token."""
    limit = query.page.limit
    if not 1 <= limit <= 1000:
        raise malformed(f"$.page.limit: 1 to 1000, got {limit}")
    ands = branches(query.filter)
    # (checked before anything is gathered: a sort it cannot do refuses the query at once)
    sorts = [(predicates.pointer_parts(pointer(spec.key), f"$.sort[{i}].key"), spec.order)
             for i, spec in enumerate(query.sort)]
    if len(ands) == 1 and not sorts:  # one native query, paged by its cursor
        where, fields = _native(ands[0])
        body: dict[str, Any] = {"scope": scope, "where": where, "limit": limit}
        if query.page.token:
            body["after"] = query.page.token
            fields.add("$.after", "$.page.token")
        try:
            found = await native(body, fields)
        except DaprError as exc:  # (the cursor refused: named as the caller sent it)
            if exc.reason is None or exc.reason.details.get("path") != "$.page.token":
                raise
            raise _not_a_token(query.page.token) from exc
        return found.entries, found.next_after
    start = _offset(query.page.token)
    gathered: dict[str, Entry] = {}
    read = 0  # bytes of values read, every branch's (each native page is within the bound)
    for branch in ands:
        where, fields = _native(branch)
        after: str | None = None
        while True:
            body = {"scope": scope, "where": where, "limit": GATHER_PAGE}
            if after is not None:
                body["after"] = after
            found = await native(body, fields)
            gathered.update((e.key, e) for e in found.entries)
            read += sum(len(e.value) for e in found.entries)
            if len(gathered) > MAX_GATHERED:
                raise _gathers_too_much(f"at most {MAX_GATHERED} entries", len(gathered),
                                        MAX_GATHERED, InvalidRequest)
            if read > max_call_bytes:
                raise _gathers_too_much(
                    f"values of at most {max_call_bytes} bytes (max_call_bytes, "
                    f"STATEWORKER_MAX_CALL_BYTES, as one native call reads), read {read}",
                    read, max_call_bytes, CallTooLarge)
            after = found.next_after
            if after is None:
                break
    entries = [gathered[k] for k in sorted(gathered)]
    for parts, order in reversed(sorts):  # (stable: the first sort key decides first)
        entries = _sorted(entries, parts, order == "DESC")
    page = entries[start:start + limit]
    more = start + limit < len(entries)
    return page, (str(start + limit) if more else None)


def _native(branch: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Fields]:
    """A branch as a native `where`, and the Dapr fields its conditions came from."""
    fields = Fields(where="$.filter")
    for n, condition in enumerate(branch):  # (its path and value: the Dapr leaf's one pair)
        for native in (f"$.where[{n}]", f"$.where[{n}].pointer", f"$.where[{n}].value"):
            fields.add(native, condition["at"])
    return [{k: v for k, v in c.items() if k != "at"} for c in branch], fields


def _sorted(entries: list[Entry], parts: tuple[str, ...], descending: bool) -> list[Entry]:
    """By the scalar at `parts` (its index encoding orders it), missing ones last."""
    keyed = [(predicates.encode(predicates.resolve(predicates.decode_doc(bytes(e.value)), parts))
              if e.value else None, e) for e in entries]
    present = [(k, e) for k, e in keyed if k is not None]
    present.sort(key=lambda pair: pair[0], reverse=descending)
    return [e for _, e in present] + [e for k, e in keyed if k is None]


def _gathers_too_much(bound: str, size: int, limit: int, error: type[StateError]
                      ) -> DaprError:
    """A query with OR or sort past a bound of what it gathers before it sorts: refused,
    never cut short (its page would be wrong)."""
    reason = error(f"$.filter: a query with OR or sort gathers every match before it sorts "
                   f"and pages: {bound}; nothing was returned: narrow the filter, or query "
                   "without OR and sort (paged as it reads)",
                   {"path": "$.filter", "size": size, "limit": limit})
    return DaprError("ERR_STATE_QUERY", http_status(reason.code), reason.message, reason)


def _offset(token: str | None) -> int:
    if not token:
        return 0
    offset = whole_number(token, 9)
    if offset is None:
        raise _not_a_token(token)
    return offset


def _not_a_token(token: str | None) -> DaprError:
    return malformed(f"$.page.token: not a token this query gave, got {shown(token)}")
