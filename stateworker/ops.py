"""`state::update` ops: their request shapes, the checks that need no document, and their
encoding for update.lua.

The checks here (path depth, segment size, empty and prototype-polluting segments, merge value
shape) depend only on the op, so they run before the script; a failing op is reported as
`{op_index, code, message}` and left out, the others still apply. The checks that depend on the
document (target types, numbers, ranges) are made by update.lua.
"""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from stateworker import codec
from stateworker.errors import InvalidRequest
from stateworker.schemas import Address

MAX_PATH_DEPTH = 32
MAX_SEGMENT_BYTES = 256
MAX_MERGE_KEYS = 1024
MAX_MERGE_DEPTH = 16
MAX_OPS = 1000
_BRACKETS = frozenset("[]{}")
PROTO_SEGMENTS = frozenset({"__proto__", "constructor", "prototype"})

Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
NestedPath = str | list[str] | None


class SetOp(Struct, tag="set", tag_field="type"):
    path: str
    value: Raw | UnsetType = UNSET  # missing means null


class RemoveOp(Struct, tag="remove", tag_field="type"):
    path: str


class IncrementOp(Struct, tag="increment", tag_field="type"):
    path: str
    by: Int64


class DecrementOp(Struct, tag="decrement", tag_field="type"):
    path: str
    by: Int64


class MergeOp(Struct, tag="merge", tag_field="type"):
    value: Raw
    path: NestedPath = None


class AppendOp(Struct, tag="append", tag_field="type"):
    value: Raw
    path: NestedPath = None


Op = SetOp | RemoveOp | IncrementOp | DecrementOp | MergeOp | AppendOp


class UpdateRequest(Address, kw_only=True):
    ops: list[Op]
    ttl_ms: int | None = None
    expected_version: int | None = None
    topic: str | UnsetType | None = UNSET  # absent: keep; null: clear


class OpError(Struct):
    op_index: int
    code: str
    message: str


class UpdateResult(Struct, omit_defaults=True):
    old_value: Raw
    new_value: Raw
    version: int
    errors: list[OpError] | UnsetType = UNSET


def op_name(op: Op) -> str:
    return type(op).__struct_config__.tag  # type: ignore[return-value]


def segments_of(op: Op) -> tuple[list[str], bool]:
    """The literal path segments of an op, and whether the path was given in array form."""
    if isinstance(op, MergeOp | AppendOp):
        if op.path is None or op.path == "":
            return [], False
        if isinstance(op.path, str):
            return [op.path], False
        return list(op.path), True
    return ([] if op.path == "" else [op.path]), False


def path_error(name: str, index: int, segments: list[str]) -> OpError | None:
    if len(segments) > MAX_PATH_DEPTH:
        return OpError(index, f"{name}.path.too_deep",
                       f"Path depth {len(segments)} exceeds maximum of {MAX_PATH_DEPTH}")
    for segment in segments:
        if segment == "":
            return OpError(index, f"{name}.path.empty_segment",
                           "Path contains an empty or non-string segment")
        size = len(segment.encode())
        if size > MAX_SEGMENT_BYTES:
            return OpError(index, f"{name}.path.segment_too_long",
                           f"Path segment of {size} bytes exceeds maximum of {MAX_SEGMENT_BYTES}")
        if segment in PROTO_SEGMENTS:
            return OpError(index, f"{name}.path.proto_polluted",
                           f"Path segment '{segment}' is not allowed (prototype pollution).")
    return None


def _depth(tree: Any) -> int:
    if isinstance(tree, dict):
        return 1 + max((_depth(v) for v in tree.values()), default=0)
    if isinstance(tree, list):
        return 1 + max((_depth(v) for v in tree), default=0)
    return 0


def merge_value_error(index: int, tree: Any) -> OpError | None:
    if not isinstance(tree, dict):
        return OpError(index, "merge.value.not_an_object", "Merge value must be a JSON object")
    for count, key in enumerate(tree, start=1):
        if key in PROTO_SEGMENTS:
            return OpError(index, "merge.value.proto_polluted",
                           f'Merge value top-level key "{key}" is a prototype-pollution sink')
        if count > MAX_MERGE_KEYS:
            return OpError(index, "merge.value.too_many_keys",
                           f"Merge value has more than {MAX_MERGE_KEYS} top-level keys")
    if _depth(tree) > MAX_MERGE_DEPTH:
        return OpError(index, "merge.value.too_deep",
                       f"Merge value JSON nesting depth exceeds maximum of {MAX_MERGE_DEPTH}")
    return None


def encode_ops(ops: list[Op], max_value_bytes: int) -> tuple[list[bytes | str | int], list[OpError]]:
    """The ARGV tail of update.lua (plain flag, count, 7 per op) for the ops that pass the
    checks, and the errors of the rest."""
    if len(ops) > MAX_OPS:
        raise InvalidRequest(f"$.ops: at most {MAX_OPS} ops per update, got {len(ops)}",
                             {"path": "$.ops", "limit": MAX_OPS})
    args: list[bytes | str | int] = []
    errors: list[OpError] = []
    count = 0
    plain = True
    for index, op in enumerate(ops):
        name = op_name(op)
        segments, array_form = segments_of(op)
        error = path_error(name, index, segments)
        if any(_BRACKETS & set(segment) for segment in segments):
            plain = False  # a segment becomes a key: a bracket in it ends the fast skip
        value = b"null"
        if error is None and isinstance(op, SetOp | MergeOp | AppendOp) and op.value is not UNSET:
            field = f"ops[{index}].value"
            tree = _decode(bytes(op.value), field)
            if isinstance(op, MergeOp):
                error = merge_value_error(index, tree)
            value = codec.compact_from_tree(tree, field, max_value_bytes)
            plain = plain and codec.plain_strings(value)
        if error is not None:
            errors.append(error)
            continue
        path = b"\0".join(codec.encode_compact(s) for s in segments)
        if isinstance(op, AppendOp) and segments:
            label, leaf = "[" + ", ".join(segments) + "]", segments[-1]
        else:
            label, leaf = (segments[0] if segments else "root"), ""
        delta = ""
        if isinstance(op, IncrementOp):
            delta = str(op.by)
        elif isinstance(op, DecrementOp):
            delta = str(-op.by)
        kind = "append_array" if isinstance(op, AppendOp) and array_form else name
        args += [index, kind, path, label, leaf, delta, value]
        count += 1
    return ["1" if plain else "", count, *args], errors


def _decode(text: bytes, field: str) -> Any:
    try:
        return codec.decode_exact(text)
    except ValueError as exc:
        raise InvalidRequest(f"$.{field}: not valid JSON: {exc}", {"path": f"$.{field}"}) from exc


def merge_errors(checked: list[OpError], applied: list[Any]) -> list[OpError]:
    """Errors from the checks and from the script (flat index, code, message), by op index."""
    from_script = [OpError(int(applied[i]), applied[i + 1].decode(), applied[i + 2].decode())
                   for i in range(0, len(applied), 3)]
    return sorted(checked + from_script, key=lambda e: e.op_index)

