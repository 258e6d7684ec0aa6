"""One spec per function: its name, request and result shapes, whether it changes nothing or
addresses a scope, the engine it belongs to, the errors it raises and its doc line.

Everything that lists the functions is derived from the specs: the functions the state
service serves and which are reads (state/functions.py binds each spec to its plan), which
take `isolation`, the engines' catalogue, the private accessors, the typed methods of
`StateStore` and `StateClient` (`spec_method`) and the README's function table (a test
compares it). The specs sit in the leaf layer because both faces use them: `StateClient` (bus)
may not import the state layer, where the plans are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from stateworker import schemas as s
from stateworker.errors import ERROR_CLASSES
from stateworker.pyvalues import ABSENT


@dataclass(frozen=True, slots=True)
class Spec:
    name: str  # the function id on the bus
    method: str  # the name of its typed methods (StateStore, StateClient)
    request: type[Any]  # the request Struct
    result: Any  # the result's type (a Struct, or what msgspec decodes it as)
    doc: str  # one line: what it does (the README's row, the typed methods' first line)
    params: tuple[str, ...] = ()  # request fields its typed methods take by position
    read_only: bool = False  # changes nothing (a bus call's id is bound with its read)
    scoped: bool = False  # addresses a scope (`isolation: "workflow"` may set it)
    engine: str = "state"  # "state" (native), or the engine it translates for
    raises: tuple[str, ...] = ()  # the error codes it raises itself, in the order documented
    unwrap: str | None = None  # the result field its typed method returns (None: the result)
    accessor: bool = False  # a claimed namespace has its own `<prefix>::<name>` of it

    @property
    def fields(self) -> frozenset[str]:
        """The request's field names."""
        return frozenset(field.encode_name for field in msgspec.structs.fields(self.request))


_ADDRESS = ("INVALID_REQUEST", "UNKNOWN_FIELD", "KEY_TOO_LONG", "RESERVED_SCOPE")
_WRITE = (*_ADDRESS, "VALUE_TOO_LARGE", "KEY_LIMIT")
_CLAIM = ("INVALID_REQUEST", "UNKNOWN_FIELD", "INVALID_PREFIX", "UNKNOWN_CALLER", "FORBIDDEN",
          "INVALID_SCOPE", "RESERVED_SCOPE", "SCOPE_CONFLICT", "SCOPE_IN_USE", "PERMISSION_DENIED")
_RELEASE = ("INVALID_REQUEST", "UNKNOWN_FIELD", "UNKNOWN_CALLER", "FORBIDDEN", "INVALID_SCOPE",
            "KEY_TOO_LONG", "RESERVED_SCOPE", "PERMISSION_DENIED")

GET = Spec("state::get", "get", s.GetRequest, msgspec.Raw,
           "the stored value, or null when missing or expired", ("scope", "key"),
           read_only=True, scoped=True, raises=_ADDRESS, accessor=True)
SET = Spec("state::set", "set", s.SetRequest, s.SetResult,
           "write a value (replacing its topic and expiry); the old and new value, version, "
           "hash", ("scope", "key", "value"), scoped=True, raises=(*_WRITE, "CONFLICT"))
DELETE = Spec("state::delete", "delete", s.DeleteRequest, msgspec.Raw,
              "remove a key (with `expected_version`: only the entry at that version); its "
              "old value, or null", ("scope", "key"), scoped=True,
              raises=(*_ADDRESS, "CONFLICT"))
LIST = Spec("state::list", "list", s.ScopeRequest, list[msgspec.Raw],
            "every live value of a scope, in key byte order", ("scope",), read_only=True,
            scoped=True, raises=_ADDRESS, accessor=True)
LIST_KEYS = Spec("state::list_keys", "list_keys", s.ScopeRequest, s.KeysResult,
                 "every live key of a scope, in byte order", ("scope",), read_only=True,
                 scoped=True, raises=_ADDRESS, unwrap="keys", accessor=True)
LIST_GROUPS = Spec("state::list_groups", "list_groups", s.EmptyRequest, s.GroupsResult,
                   "the scopes holding at least one entry, byte-sorted", read_only=True,
                   raises=("UNKNOWN_FIELD",), unwrap="groups")
COMPARE_AND_SET = Spec(
    "state::compare-and-set", "compare_and_set", s.CompareAndSetRequest, s.SwapResult,
    "write only if the stored value deep-equals `expected` (absent: the key must be); "
    "`{swapped}` or `{swapped: false, current}`", ("scope", "key", "value", "expected"),
    scoped=True, raises=_WRITE, accessor=True)
GET_ENTRY = Spec("state::get-entry", "get_entry", s.GetEntryRequest, s.EntryResult,
                 "an entry with its version, hash, topic, times, writer and revision",
                 ("scope", "key"), read_only=True, scoped=True,
                 raises=(*_ADDRESS, "NOT_FOUND"))
UPDATE = Spec("state::update", "update", s.UpdateRequest, s.UpdateResult,
              "apply ops (set, remove, increment, decrement, merge, append) in one atomic "
              "step; the ops that cannot apply are reported, not raised (`errors`: "
              "`{op_index, code, message, doc_url}`)",
              ("scope", "key", "ops"), scoped=True, raises=(*_WRITE, "CONFLICT"))
LIST_ENTRIES = Spec("state::list-entries", "list_entries", s.ListEntriesRequest,
                    s.ListEntriesResult,
                    "one page of a scope's entries with their metadata (filters, order, "
                    "`next_after`)", ("scope",), read_only=True, scoped=True,
                    raises=_ADDRESS)
DIFF = Spec("state::diff", "diff", s.DiffRequest, s.DiffResult,
            "compare with the stored value by hash; write only when it changed",
            ("scope", "key", "value"), scoped=True, raises=(*_WRITE, "CONFLICT"))
UPDATE_TOPIC = Spec("state::update-topic", "update_topic", s.UpdateTopicRequest,
                    s.UpdatedResult, "retag an entry (null clears); its value and version stay",
                    ("scope", "key", "topic"), scoped=True, raises=_ADDRESS)
DELETE_BY_TOPIC = Spec("state::delete-by-topic", "delete_by_topic", s.DeleteByTopicRequest,
                       s.DeletedResult, "delete every entry whose topic matches the pattern",
                       ("scope", "topic_pattern"), scoped=True, raises=_ADDRESS)
LIST_NAMESPACES = Spec("state::list-namespaces", "list_namespaces", s.ListNamespacesRequest,
                       s.NamespacesResult, "the scopes holding entries, by pattern and limit",
                       read_only=True, raises=("INVALID_REQUEST", "UNKNOWN_FIELD"))
BARRIER = Spec("state::barrier", "barrier", s.BarrierRequest, s.BarrierDecision,
               "record one arrival; `skip` until the expected set has arrived, then `allow` "
               "exactly once with each key's carried value", ("event", "condition_config"),
               raises=("BARRIER_CONFIG", "INVALID_REQUEST", "UNKNOWN_FIELD", "KEY_TOO_LONG",
                       "VALUE_TOO_LARGE"))
DELETE_BARRIER = Spec("state::delete-barrier", "delete_barrier", s.DeleteBarrierRequest,
                      s.BarrierDeletedResult, "delete a barrier, complete or not, with every "
                      "payload it holds (`deleted: false`: there was none)", ("id",),
                      raises=("INVALID_REQUEST", "UNKNOWN_FIELD", "KEY_TOO_LONG"),
                      unwrap="deleted")
CLAIM_NAMESPACE = Spec("state::claim-namespace", "claim_namespace", s.ClaimNamespaceRequest,
                       s.ClaimResult, "reserve scopes for the calling worker's private "
                       "namespace (none in public use, unless an admin adopts it)",
                       ("functions_prefix", "scopes"), raises=_CLAIM)
RELEASE_NAMESPACE = Spec("state::release-namespace", "release_namespace",
                         s.ReleaseNamespaceRequest, s.ReleaseResult,
                         "make a namespace's scopes public again (entries kept): by their "
                         "owner, or an admin with `force`", ("scopes",), raises=_RELEASE)
REGISTER_TRIGGER = Spec("state::register-trigger", "register_trigger",
                        s.RegisterTriggerRequest, s.TriggerIdResult,
                        "call a service's function for every matching change event",
                        ("function_id", "service"),
                        raises=("INVALID_REQUEST", "UNKNOWN_FIELD", "PERMISSION_DENIED"))
KEEP_TRIGGER = Spec("state::keep-trigger", "keep_trigger", s.KeepTriggerRequest, s.KeptResult,
                    "renew a trigger registered with `ttl_ms` (a lease); its new `expires_at`",
                    ("id",), raises=("INVALID_REQUEST", "UNKNOWN_FIELD", "NOT_FOUND",
                                                  "PERMISSION_DENIED", "CONFLICT"))
UNREGISTER_TRIGGER = Spec("state::unregister-trigger", "unregister_trigger",
                          s.TriggerIdRequest, s.UnregisteredResult, "remove a trigger",
                          ("id",), raises=("INVALID_REQUEST", "UNKNOWN_FIELD", "PERMISSION_DENIED"))
LIST_TRIGGERS = Spec("state::list-triggers", "list_triggers", s.EmptyRequest,
                     s.TriggersResult, "every registered trigger", read_only=True,
                     raises=("UNKNOWN_FIELD",))
QUERY = Spec("state::query", "query", s.QueryRequest, s.QueryResult,
              "one page of a scope's entries whose values satisfy every `where` condition "
              "(RFC 6901 pointers; eq, ne, lt, lte, gt, gte, in, exists, prefix; numbers "
              "exact), in key order, with `next_after`", ("scope", "where"), read_only=True,
              scoped=True, raises=_ADDRESS)
CREATE_INDEX = Spec("state::create-index", "create_index", s.IndexRequest, s.CreateIndexResult,
                    "index a pointer of a scope's values for `state::query` (built in bounded "
                    "batches; again resumes an unfinished build)", ("scope", "pointer"),
                    scoped=True, raises=_ADDRESS)
DROP_INDEX = Spec("state::drop-index", "drop_index", s.IndexRequest, s.DropIndexResult,
                  "remove a scope's index of a pointer", ("scope", "pointer"), scoped=True,
                  raises=_ADDRESS)
LIST_INDEXES = Spec("state::list-indexes", "list_indexes", s.ScopeIndexesRequest,
                    s.IndexesResult, "a scope's indexes: pointer, state (building or ready), "
                    "indexed and total keys", ("scope",), read_only=True, scoped=True,
                    raises=_ADDRESS, unwrap="indexes")

TRANSACTION = Spec("state::transaction", "transaction", s.TransactionRequest,
                   s.TransactionResult,
                   "several keys of one scope written all or nothing: set, update, delete, "
                   "compare-and-set and check ops, all checked before the first write; with "
                   "`compare`, `ops` or `else_ops`", ("scope", "ops"), scoped=True,
                   raises=(*_WRITE, "CONFLICT", "DUPLICATE_KEY", "CALL_TOO_LARGE"))

SET_MANY = Spec("state::set-many", "set_many", s.SetManyRequest, s.BulkResult,
                "write many keys of one scope in one step, each on its own (`expected_version` "
                "per entry); each entry's outcome and an `errors` list",
                ("scope", "entries"), scoped=True,
                raises=(*_WRITE, "DUPLICATE_KEY", "CALL_TOO_LARGE"))
DELETE_MANY = Spec("state::delete-many", "delete_many", s.DeleteManyRequest, s.BulkResult,
                   "delete many keys of one scope in one step, each on its own "
                   "(`expected_version` per entry); each entry's outcome and an `errors` list",
                   ("scope", "entries"), scoped=True,
                   raises=(*_ADDRESS, "DUPLICATE_KEY", "CALL_TOO_LARGE"))
GET_MANY = Spec("state::get-many", "get_many", s.GetManyRequest, s.GetManyResult,
                "several entries of a scope in one step, in the order asked, each as "
                "`get-entry` gives it (`{found: false}` for a miss); values of at most "
                "`max_call_bytes` in all", ("scope", "keys"), read_only=True,
                scoped=True, raises=(*_ADDRESS, "CALL_TOO_LARGE"),
                unwrap="entries")
DELETE_BY_PREFIX = Spec("state::delete-by-prefix", "delete_by_prefix", s.DeleteByPrefixRequest,
                        s.PrefixDeletedResult, "delete up to `limit` entries whose key starts "
                        "with `prefix`, in key order; `more`: call again", ("scope", "prefix"),
                        scoped=True, raises=_ADDRESS)

UI_CONTENT = Spec("state::ui-content", "ui_content", s.UiContentRequest, s.UiContentResult,
                  "a file of the console, verbatim with its content type (iii's console "
                  "content function; the HTTP face serves the same files at /console/)",
                  ("path",), read_only=True, raises=("UNKNOWN_FIELD", "NOT_FOUND"))

LIST_ENTRIES_PAGE = Spec(
    "state::list_entries", "list_entries_page", s.EntriesPageRequest, s.EntriesPage,
    "iii's paged listing: the first call snapshots the scope, each page (`limit`, `max_bytes`) "
    "gives `[key, value]` rows in key order, `offset`, `total`, `done` and a single-use "
    "`next_cursor`", ("scope",), read_only=True, scoped=True,
    raises=(*_ADDRESS, "UNKNOWN_CALLER", "INVALID_CURSOR", "ROW_TOO_LARGE", "SNAPSHOT_CAPACITY"),
    accessor=True)
ON_CONFIG_CHANGE = Spec(
    "state::on-config-change", "on_config_change", s.ConfigChangeRequest, s.ConfigChangeResult,
    "store the live settings given (`max_value_bytes`, `triggers_enabled`; null: back to the "
    "start value) and make every replica reload them; `{}` only reloads",
    raises=("INVALID_REQUEST", "UNKNOWN_FIELD", "PERMISSION_DENIED"))

NATIVE: tuple[Spec, ...] = (
    GET, SET, DELETE, LIST, LIST_KEYS, LIST_GROUPS, COMPARE_AND_SET, GET_ENTRY, UPDATE,
    LIST_ENTRIES, DIFF, UPDATE_TOPIC, DELETE_BY_TOPIC, LIST_NAMESPACES, BARRIER,
    DELETE_BARRIER, CLAIM_NAMESPACE, RELEASE_NAMESPACE, REGISTER_TRIGGER, KEEP_TRIGGER, UNREGISTER_TRIGGER,
    LIST_TRIGGERS, TRANSACTION, SET_MANY, DELETE_MANY, GET_MANY, DELETE_BY_PREFIX, QUERY,
    CREATE_INDEX, DROP_INDEX, LIST_INDEXES, UI_CONTENT, LIST_ENTRIES_PAGE, ON_CONFIG_CHANGE)
ACCESSORS: tuple[str, ...] = tuple(spec.name for spec in NATIVE if spec.accessor)


# ---- the one "Raises" text -------------------------------------------------------------------------
_WHY: dict[str, str] = {
    "INVALID_REQUEST": "a field is missing, of the wrong type or out of its range, or a text "
                       "is not valid UTF-8 (`details.path` names it)",
    "UNKNOWN_FIELD": "the request names a field the function does not take (`details.path`; "
                     "`details.nearest`, the known field nearest to it)",
    "KEY_TOO_LONG": "scope or key is over `max_key_bytes`",
    "RESERVED_SCOPE": "the scope is one the service keeps for itself, or one a private "
                      "namespace claimed",
    "VALUE_TOO_LARGE": "a value is over `max_value_bytes` (a barrier's payload: over 2 MiB)",
    "KEY_LIMIT": "the key is new and the scope holds `max_keys` live keys",
    "CONFLICT": "`expected_version` / `create_only` did not hold, or the trigger to keep was "
                "replaced while being kept; nothing was written",
    "NOT_FOUND": "`required: true` and the entry is missing, or the trigger to keep is unknown "
                 "or expired",
    "BARRIER_CONFIG": "`condition_config` is missing or bad, or its `expect` is not the one "
                      "the barrier's first arrival fixed",
    "INVALID_PREFIX": "`functions_prefix` is not `[A-Za-z0-9_-]+`",
    "UNKNOWN_CALLER": "the call has no caller",
    "FORBIDDEN": "the prefix is not the caller (`acl`: the principal), or a scope to release "
                 "is another namespace's (`details.owner`)",
    "INVALID_SCOPE": "a scope is not non-empty text, or one to release is not claimed",
    "SCOPE_CONFLICT": "a scope is owned by another namespace (`details.owner`)",
    "INVALID_CONTEXT": "the call's context lacks the field the engine takes the caller from",
    "SCOPE_IN_USE": "a public scope asked for is in use: it holds entries, a trigger names it or "
                    "it was written within the dedupe window (`details.scope`; an admin may "
                    "adopt it)",
    "PERMISSION_DENIED": "`acl` mode: the principal's roles do not grant the function on the "
                         "scope, an admin's option (`adopt`, `force`) or a trigger's target "
                         "service (`details`: principal, fn, scope or service, missing)",
    "ReservedNamespaceError": "the namespace is `secret` or `<anyone>:secret` (moco)",
    "DUPLICATE_KEY": "a transaction's list of ops writes one key twice",
    "INVALID_CURSOR": "`cursor` is not a live one of this listing: unknown, expired (120 s), "
                      "already read, dropped for the caller's newer listings (4 live a "
                      "partition), or issued for another scope, caller, limit or max_bytes",
    "ROW_TOO_LARGE": "the next entry cannot fit a page of `max_bytes` on its own (never "
                     "skipped)",
    "SNAPSHOT_CAPACITY": "a snapshot would pass its bounds: live snapshots of the partition "
                         "(16, none of them the caller's), entries, or bytes "
                         "(`max_call_bytes`)",
    "CALL_TOO_LARGE": "the call's ops would read and write more than `max_call_bytes` of "
                      "values, or its updates hold more than 10000 ops in all (nothing written: "
                      "split it)",
}


MARK = "function_spec"  # the attribute that ties a typed method to its spec


class Face(NamedTuple):
    """A typed face of the functions: the method its typed methods run a call through (Python
    values in and out, tagged types converted), and the errors it adds to every call's."""

    via: str
    errors: str


def raises_text(spec: Spec, face: Face) -> str:
    """The "Raises:" section of `spec`'s typed method on `face`."""
    lines = [f"    {ERROR_CLASSES[code].__name__} ({code}): {_WHY[code]}." for code in spec.raises]
    return "Raises:\n" + "\n".join([*lines, *("    " + e for e in face.errors.splitlines())])


def docstring(spec: Spec, face: Face) -> str:
    """A generated typed method's docstring: the doc line, its arguments, the Raises text."""
    args = ", ".join(spec.params) or "(none)"
    return (f"`{spec.name}`: {spec.doc}.\n\nArgs:\n    {args}: the request's fields of those "
            f"names.\n    **options: the request's other fields, and `{face.via}`'s options."
            f"\n\n{raises_text(spec, face)}\n")


def with_raises(spec: Spec, face: Face) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a hand-written typed method of `spec`: its docstring gets the one "Raises"
    text (appended), and the method is marked as `spec`'s."""
    def mark(method: Callable[..., Any]) -> Callable[..., Any]:
        method.__doc__ = (inspect.cleandoc(method.__doc__ or "") + "\n\n"
                          + raises_text(spec, face) + "\n")
        setattr(method, MARK, spec)
        return method

    return mark


def _positional(value: Any) -> Any:
    """An argument as a JSON-able value: a set, tuple or iterator of scopes ... as a list."""
    if isinstance(value, set | frozenset | tuple | Iterator):
        return list(value)
    return value


def _body(params: tuple[str, ...], fields: frozenset[str], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the request body, the call's options) of a typed method's arguments; ABSENT (an
    argument left out, e.g. compare-and-set's `expected`) leaves its field out."""
    body = {field: _positional(arg) for field, arg in zip(params, args, strict=False)
            if arg is not ABSENT}
    options = {}
    for key, value in kwargs.items():
        if key in fields:
            if value is not ABSENT:
                body[key] = value
        else:
            options[key] = value
    return body, options


def spec_method(spec: Spec, face: Face) -> Callable[..., Coroutine[Any, Any, Any]]:
    """`spec`'s typed method on `face`: positional arguments are the fields `spec.params`,
    keyword arguments the request's other fields or, when not request fields, options of the
    face's call (timeout, call_id ...); the result (or its `unwrap` field) as Python values."""
    params, fields, name, via, unwrap = (spec.params, spec.fields, spec.name, face.via,
                                         spec.unwrap)

    async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(params):
            raise TypeError(f"{spec.method}() takes at most {len(params)} positional "
                            f"arguments ({', '.join(params)}), {len(args)} were given")
        body, options = _body(params, fields, args, kwargs)
        result = await getattr(self, via)(name, body, **options)
        return result if unwrap is None else result[unwrap]

    method.__name__ = method.__qualname__ = spec.method
    method.__doc__ = docstring(spec, face)
    method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
        + [inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)])
    setattr(method, MARK, spec)
    return method


def typed_methods(cls: type) -> dict[str, Spec]:
    """The typed methods of `cls` (its own and inherited), by name, with their spec."""
    return {name: getattr(member, MARK) for name, member in inspect.getmembers(cls)
            if isinstance(getattr(member, MARK, None), Spec)}


def table(every: tuple[Spec, ...]) -> list[str]:
    """The README's function table (its rows are tested against the specs)."""
    rows = ["| function | engine | reads only | typed method | what it does |",
            "|---|---|---|---|---|"]
    for spec in every:
        method = (f"`{spec.method}({', '.join(spec.params)})`" if spec.engine == "state"
                  else f"`typed({spec.engine}.specs.{spec.method.upper()}, request)`")
        rows.append(f"| `{spec.name}` | {spec.engine} | {'yes' if spec.read_only else ''} | "
                    f"{method} | {spec.doc} |")
    return rows
