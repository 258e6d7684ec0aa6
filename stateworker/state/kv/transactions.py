"""`state::transaction`: several entries of one scope written as one atomic unit.

Everything that needs no stored state is checked here, before the script runs: the shapes,
every key and value (their limits), every update op's path and value (an op error found here
fails the transaction as the script's would), and that no key is written twice in one list
(DUPLICATE_KEY), etcd's rule: a key deleted twice is deleted once (each delete answered with
the one outcome), a key set twice, or set and deleted, is refused. transaction.lua then
checks every precondition and builds every new value before its first write, so a
transaction is applied whole or not at all. One partition holds the whole scope, so it is one
script on one Redis, and one slot on a Redis Cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import msgspec

from stateworker import codec
from stateworker.context import CallContext
from stateworker.error_codes import doc_url
from stateworker.errors import (
    DuplicateKey,
    InternalError,
    InvalidRequest,
    OpFailed,
    StateError,
    shown,
)
from stateworker.schemas.base import NULL
from stateworker.schemas.bulk import (
    CheckFields,
    TransactionRequest,
    TransactionResult,
    TxCheck,
    TxCompareAndSet,
    TxDelete,
    TxOp,
    TxOpResult,
    TxSet,
    TxUpdate,
)
from stateworker.scripts.bindings import (
    KEEP,
    TRANSACTION,
    optional,
    topic_arg,
    transaction_args,
    ttl_arg,
    version_condition,
)
from stateworker.scripts.statuses import LUA_STATUS, STATUS_ERRORS, STATUS_TEXTS, Target
from stateworker.state.core import validate
from stateworker.state.core.store import RedisState
from stateworker.state.kv import ops
from stateworker.state.kv.reads import hash_plan
from stateworker.transport.plans import Plan, then
from stateworker.transport.wire import Arg

MAX_TX_OPS = 100  # ops in `ops`, in `else_ops` and items in `compare`, each
# The updates' ops of one transaction are counted in steps, in all (ops.MAX_CALL_STEPS):
# with max_call_bytes, what keeps one call's script near 100 ms.
_HASH_RETRIES = 3  # stored hashes an update left unknown, computed before giving up
_OK, _ABORTED, _NEEDS_HASH = LUA_STATUS["OK"], LUA_STATUS["TX_ABORTED"], LUA_STATUS["NEEDS_HASH"]
_CONFLICT, _OP_FAILED = LUA_STATUS["CONFLICT"], LUA_STATUS["OP_FAILED"]
_KINDS: dict[type, str] = {TxSet: "set", TxUpdate: "update", TxDelete: "delete", TxCompareAndSet: "cas",
          TxCheck: "check"}
_OP_NAMES: dict[type, str] = {TxSet: "set", TxUpdate: "update", TxDelete: "delete",
             TxCompareAndSet: "compare-and-set", TxCheck: "check"}


@contextmanager
def _at(path: str) -> Iterator[None]:
    """Errors of the checks made for one op, placed at the op (`$.ttl_ms` -> `$.ops[2].ttl_ms`)."""
    try:
        yield
    except StateError as exc:
        where = exc.details.get("path")
        if isinstance(where, str) and where.startswith("$."):
            exc.details["path"] = path + where[1:]
            exc.message = exc.message.replace(where, exc.details["path"], 1) \
                if where in exc.message else f"{exc.details['path']}: {exc.message}"
            exc.args = (exc.message,)
        raise


class Encoded:
    """The script's ARGV for one list of items, and what the reply needs to be read."""

    def __init__(self) -> None:
        self.args: list[Arg] = []
        self.values: dict[int, codec.Value] = {}  # set / compare-and-set: op index -> value


def _check_args(item: CheckFields, path: str) -> list[Arg]:
    """A check's version, hash and presence arguments."""
    given = [name for name in ("expected_version", "expected_hash", "exists", "absent")
             if getattr(item, name) is not None]
    if not given:
        raise InvalidRequest(f"{path}: a check needs at least one of expected_version, "
                             "expected_hash, exists, absent", {"path": path})
    with _at(path):
        validate.expected_version(item.expected_version)
    digest = item.expected_hash
    if digest is not None and (len(digest) != 64 or digest.strip("0123456789abcdef")):
        raise InvalidRequest(f"{path}.expected_hash: must be 64 lowercase hex digits (a value's "
                             f"`hash`), got {shown(digest)}", {"path": f"{path}.expected_hash"})
    present = {item.exists, None if item.absent is None else not item.absent} - {None}
    if len(present) > 1:
        raise InvalidRequest(f"{path}: `exists` and `absent` contradict each other",
                             {"path": path})
    presence = "" if not present else "e" if present.pop() else "a"
    return [optional(item.expected_version), digest or "", presence]


def _op_args(state: RedisState, op: TxSet | TxUpdate | TxDelete | TxCompareAndSet, index: int,
             path: str, encoded: Encoded) -> list[Arg]:
    """One op's ARGV after its kind and key (transaction.lua's header)."""
    settings = state.settings
    with _at(path):
        if isinstance(op, TxSet):
            value = validate.value(settings, op.value)
            encoded.values[index] = value
            validate.topic(op.topic)
            version = validate.expected_version(op.expected_version)
            condition = version_condition(version, op.create_only)
            return [value.json, value.hash, topic_arg(op.topic),
                    ttl_arg(validate.ttl_ms(op.ttl_ms)), condition,
                    "1" if value.plain_strings else ""]
        if isinstance(op, TxCompareAndSet):
            value = validate.value(settings, op.value)
            encoded.values[index] = value
            expected = None if op.expected is msgspec.UNSET else \
                validate.value(settings, op.expected, "expected")
            condition = "a" if expected is None or expected.json == b"null" else \
                "h" + expected.hash
            return [value.json, value.hash, condition, "1" if value.plain_strings else ""]
        if isinstance(op, TxDelete):
            return [optional(validate.delete_version(op.expected_version))]
        if isinstance(op.topic, str):
            validate.topic(op.topic)
        update = ops.encode_ops(op.ops, settings.max_value_bytes)
        args = [optional(validate.expected_version(op.expected_version)),
                topic_arg(KEEP if op.topic is msgspec.UNSET else op.topic),
                optional(validate.ttl_ms(op.ttl_ms)), *update.args]
    if update.errors:  # (outside `_at`: its path is the op's already)
        raise _op_error(op, index, path, update.errors[0], state.settings.docs_url)
    return args


def _op_error(op: TxUpdate, index: int, path: str, error: Any, docs_url: str) -> OpFailed:
    return OpFailed(error.code, f"{path}.ops[{error.op_index}]: {error.message.rstrip('.')}; "
                    "the transaction wrote nothing",
                    {"path": f"{path}.ops[{error.op_index}]", "op_index": index,
                     "update_op_index": error.op_index, "key": op.key,
                     "doc_url": doc_url(error.code, docs_url)})


class Once(NamedTuple):
    """One list of ops as the script runs it: each key's repeated deletes applied once.
    `at[i]`: the index in `ops` of the request's op i; `origin[k]`: the request's index of op k."""

    ops: list[TxOp]
    at: list[int]
    origin: list[int]


def once(items: list[TxOp], field: str) -> Once:
    """`items` with a key's later deletes folded into its first (their conditions must agree:
    two different expected versions cannot both hold)."""
    kept: list[TxOp] = []
    at: list[int] = []
    origin: list[int] = []
    deletes: dict[str, int] = {}  # key -> the index of its delete in `kept`
    for index, op in enumerate(items):
        first = deletes.get(op.key) if isinstance(op, TxDelete) else None
        if first is None:
            if isinstance(op, TxDelete):
                deletes[op.key] = len(kept)
            at.append(len(kept))
            origin.append(index)
            kept.append(op)
            continue
        earlier = kept[first]
        assert isinstance(earlier, TxDelete) and isinstance(op, TxDelete)
        if None not in (earlier.expected_version, op.expected_version) and \
                earlier.expected_version != op.expected_version:
            path = f"$.{field}[{index}]"
            raise DuplicateKey(
                f"{path}: key {shown(op.key)} is deleted twice in `{field}` ({origin[first]} "
                f"and {index}) at different expected versions ({earlier.expected_version} and "
                f"{op.expected_version}); both cannot hold",
                {"path": path, "key": op.key, "op_index": index, "first_index": origin[first]})
        if earlier.expected_version is None:
            kept[first] = msgspec.structs.replace(earlier, expected_version=op.expected_version)
        at.append(first)
    return Once(kept, at, origin)


def encode_items(state: RedisState, items: Sequence[TxOp | CheckFields], field: str,
                 limit: int = MAX_TX_OPS, what: str = "per transaction",
                 origin: Sequence[int] | None = None) -> Encoded:
    """transaction.lua's items of one list (`field`), checked: at most `limit` of them
    (`origin`: each item's index in the request, when some were folded: `once`)."""
    if len(items) > limit:
        raise InvalidRequest(f"$.{field}: at most {limit} {what}, got {len(items)}",
                             {"path": f"$.{field}", "limit": limit})
    encoded = Encoded()
    written: dict[str, int] = {}
    for index, item in enumerate(items):
        path = f"$.{field}[{index if origin is None else origin[index]}]"
        validate.name(state.settings, f"{field}[{index}].key", item.key)
        if isinstance(item, CheckFields):  # a `compare` item or a `check` op: writes nothing
            kind = "check"
            args = _check_args(item, path)
        else:
            kind = _KINDS[type(item)]
            args = _op_args(state, item, index, path, encoded)
            first = written.setdefault(item.key, index)
            if first != index:
                raise DuplicateKey(
                    f"{path}: key {shown(item.key)} is written twice in `{field}` ({first} and "
                    f"{index}); one call writes each key once (which write should win would "
                    "be a guess)",
                    {"path": path, "key": item.key, "op_index": index, "first_index": first})
        encoded.args += [kind, item.key, *args]
    return encoded


def script_args(state: RedisState, scope: str, tx_id: str, max_keys: int | None,
                lists: list[tuple[int, Encoded]]) -> list[Arg]:
    """transaction.lua's own ARGV (bindings.transaction_args), `max_keys` checked first."""
    return transaction_args(state.settings, state.keys.for_scope(scope), scope, tx_id,
                            validate.max_keys(max_keys), [(n, items.args) for n, items in lists])


def state_transaction(state: RedisState, req: TransactionRequest, ctx: CallContext) -> Plan:
    validate.scope(state, ctx, req.scope)
    if req.else_ops is not None and req.compare is None:
        raise InvalidRequest("$.else_ops: runs when `compare` does not hold, and there is no "
                             "`compare`", {"path": "$.else_ops"})
    compare, then_ops, else_ops = req.compare or [], req.ops, req.else_ops or []
    if not compare and not then_ops:
        raise InvalidRequest("$.ops: a transaction needs at least one op (or a `compare`)",
                             {"path": "$.ops"})
    _count_update_ops(then_ops, else_ops)
    runs = (once(then_ops, "ops"), once(else_ops, "else_ops"))
    encoded = [encode_items(state, compare, "compare"),
               encode_items(state, runs[0].ops, "ops", origin=runs[0].origin),
               encode_items(state, runs[1].ops, "else_ops", origin=runs[1].origin)]
    first_key = (compare or then_ops or else_ops)[0].key
    args = script_args(state, req.scope, uuid.uuid4().hex, req.max_keys,
                       [(len(compare), encoded[0]), (len(runs[0].ops), encoded[1]),
                        (len(runs[1].ops), encoded[2])])
    return _attempt(state, req, ctx, first_key, args, encoded, runs, _HASH_RETRIES)


def _count_update_ops(then_ops: list[TxOp], else_ops: list[TxOp]) -> None:
    """The updates' ops of both branches, in all, within ops.MAX_CALL_STEPS (CALL_TOO_LARGE
    naming the update that passed it)."""
    total = 0
    for field, items in (("ops", then_ops), ("else_ops", else_ops)):
        for index, op in enumerate(items):
            if isinstance(op, TxUpdate):
                total = ops.check_steps(op.ops, f"$.{field}[{index}].ops", total)


def _attempt(state: RedisState, req: TransactionRequest, ctx: CallContext, first_key: str,
             args: list[Arg], encoded: list[Encoded], runs: tuple[Once, Once],
             left: int) -> Plan:
    """One run of transaction.lua; a stored hash an update left unknown is computed and
    stored first, then the transaction runs again (`left` more times)."""
    def finish(reply: list[Any]) -> Any:
        status = reply[0]
        if status == _NEEDS_HASH:
            if left == 0:
                raise InternalError(f"the hash of key {shown(reply[1])} in scope "
                                    f"{shown(req.scope)} kept changing")
            key = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return then(hash_plan(state, req.scope, key, reply[2], reply[3] or b""),
                        lambda _digest: _attempt(state, req, ctx, first_key, args, encoded,
                                                 runs, left - 1))
        if status == _ABORTED:
            raise _aborted(state, req, ctx, reply, runs)
        return _result(req, reply, encoded, runs)

    target = state.target(req.scope, first_key, ctx)
    return state.entry_plan(TRANSACTION, target, args, finish)


def _branch(req: TransactionRequest, reply_branch: int, runs: tuple[Once, Once]
            ) -> tuple[str, list[TxOp], Once]:
    if reply_branch == 1:
        return "ops", req.ops, runs[0]
    return "else_ops", req.else_ops or [], runs[1]


def _aborted(state: RedisState, req: TransactionRequest, ctx: CallContext,
             reply: list[Any], runs: tuple[Once, Once]) -> StateError:
    """The error of the op that stopped the transaction (TX_ABORTED: its index, status and
    the status's own reply)."""
    field, ops_list, run = _branch(req, reply[1], runs)
    index, status, inner = run.origin[reply[2]], reply[3], reply[3:]
    op = ops_list[index]
    path = f"$.{field}[{index}]"
    name = _OP_NAMES[type(op)]
    if status == _OP_FAILED:
        assert isinstance(op, TxUpdate)
        error = ops.script_error(op.ops[inner[1]], inner[1], inner[2].decode(), inner[3].decode())
        return _op_error(op, index, path, error, state.settings.docs_url)
    expected = getattr(op, "expected_version", None)
    create_only = isinstance(op, TxSet) and op.create_only
    target = Target(state.settings, req.scope, op.key, ctx, expected, create_only)
    if status == _CONFLICT and isinstance(op, TxCheck | TxCompareAndSet):
        message, details = _unmet(op, inner, target)
    else:
        message, details = STATUS_TEXTS[status](target, inner)
    details = {**details, "path": path, "op_index": index, "key": op.key}
    return STATUS_ERRORS[status](f"{path} ({name} of key {shown(op.key)}): {message}; the "
                                 "transaction wrote nothing", details)


def _unmet(op: TxCheck | TxCompareAndSet, inner: list[Any], target: Target
           ) -> tuple[str, dict[str, Any]]:
    current = inner[1]
    where = f"key {shown(target.key)} in scope {shown(target.scope)}"
    if isinstance(op, TxCompareAndSet):
        return (f"the stored value of {where} is not the expected one (current version "
                f"{current}, 0: absent)", {"current_version": current})
    wanted = {name: getattr(op, name) for name in
              ("expected_version", "expected_hash", "exists", "absent")
              if getattr(op, name) is not None}
    return (f"check {shown(wanted)} does not hold for {where} (current version {current}, 0: "
            "absent)", {**wanted, "current_version": current})


def _result(req: TransactionRequest, reply: list[Any], encoded: list[Encoded],
            runs: tuple[Once, Once]) -> TransactionResult:
    field, ops_list, run = _branch(req, reply[1], runs)
    values = encoded[1 if field == "ops" else 2].values
    results = []
    for index, op in enumerate(ops_list):  # (a key deleted twice: each with the one outcome)
        ran = run.at[index]
        old, new, version, created = reply[4 + 4 * ran: 8 + 4 * ran]
        results.append(_op_result(op, values.get(ran), old, new, version, created == 1))
    revision = reply[2].decode() if isinstance(reply[2], bytes) else None
    return TransactionResult(branch="ops" if field == "ops" else "else_ops", results=results,
                             revision=revision, tx=reply[3].decode())


def _raw(value: bytes | None) -> msgspec.Raw:
    return NULL if not value else msgspec.Raw(value)


def _op_result(op: TxOp, value: codec.Value | None, old: Any, new: Any, version: int,
               created: bool) -> TxOpResult:
    name = _OP_NAMES[type(op)]
    if isinstance(op, TxCheck):
        return TxOpResult(op=name, key=op.key, version=version)
    if isinstance(op, TxDelete):
        return TxOpResult(op=name, key=op.key, version=0, old_value=_raw(old),
                          deleted=old is not None and old is not False)
    if isinstance(op, TxUpdate):
        return TxOpResult(op=name, key=op.key, version=version, old_value=_raw(old),
                          new_value=_raw(new), created=created)
    assert value is not None
    return TxOpResult(op=name, key=op.key, version=version, old_value=_raw(old),
                      new_value=msgspec.Raw(value.json), hash=value.hash, created=created)
