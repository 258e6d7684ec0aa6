"""`state::update` ops (their shapes: schemas/base.py): the checks that need no document, and their
encoding for update.lua.

The checks here (path depth, segment size, empty and prototype-polluting segments, merge value
shape) depend only on the op, so they run before the script; a failing op is reported as
`{op_index, code, message, doc_url}` and left out, the others still apply. The checks that
depend on the document (target types, numbers, ranges) are made by update.lua. `OP_CODES` lists
every code either gives; docs/errors.md has a section for each, which `doc_url` links to.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any

import msgspec
from msgspec import UNSET, Struct

from stateworker import codec
from stateworker.error_codes import doc_url
from stateworker.errors import CallTooLarge, InvalidRequest
from stateworker.schemas import AppendOp, DecrementOp, IncrementOp, MergeOp, Op, OpError, RemoveOp, SetOp
from stateworker.scripts.replies import UpdateReply

MAX_PATH_DEPTH = 32
MAX_SEGMENT_BYTES = 256
MAX_MERGE_KEYS = 1024
MAX_MERGE_DEPTH = 16
MAX_OPS = 1000
# update.lua's work, counted in steps: an op 1, each level of its path past the first 1 more
# (every op walks its path from the root), each top-level key of a merge value 1 more (each is
# put into the target). One call's ops take at most MAX_CALL_STEPS (state::update's, and a
# transaction's updates in all): about 30 ms of the script. The op count alone let 400 merges
# of 1,000 keys (4 MB) hold Redis 0.8 to 1.4 s in one update, and 10,000 ops on 16-level
# paths 0.15 to 0.26 s in one transaction (docs/decisions/0071).
MAX_CALL_STEPS = 10_000
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])  # a merge value's keys, not its values
_BRACKETS = frozenset("[]{}")
PROTO_SEGMENTS = frozenset({"__proto__", "constructor", "prototype"})

# Every op error code: the path checks here (a `set`, `remove`, `increment` or `decrement` path is
# one field, so never too deep nor an empty segment), the merge value's, and update.lua's.
_ONE_FIELD = ("path.segment_too_long", "path.proto_polluted")
_NESTED = ("path.too_deep", "path.empty_segment", *_ONE_FIELD)
OP_CODES: tuple[str, ...] = (
    *(f"set.{c}" for c in (*_ONE_FIELD, "target_not_object")),
    *(f"remove.{c}" for c in (*_ONE_FIELD, "target_not_object")),
    *(f"{op}.{c}" for op in ("increment", "decrement")
      for c in (*_ONE_FIELD, "target_not_object", "not_number", "out_of_range")),
    *(f"merge.{c}" for c in (*_NESTED, "value.not_an_object", "value.proto_polluted",
                             "value.too_many_keys", "value.too_deep", "target_not_object")),
    *(f"append.{c}" for c in (*_NESTED, "target_not_object", "type_mismatch")),
)

_NAMES: dict[type, str] = {SetOp: "set", RemoveOp: "remove", IncrementOp: "increment",
                           DecrementOp: "decrement", MergeOp: "merge", AppendOp: "append"}
_WITH_VALUE = (SetOp, MergeOp, AppendOp)


def segments_of(op: Op) -> tuple[list[str], bool]:
    """The literal path segments of an op, and whether the path was given in array form."""
    path = op.path
    if path is None or path == "":
        return [], False
    if isinstance(path, str):
        return [path], False
    return list(path), True


def _segment_problem(segment: str) -> tuple[str, str] | None:
    """What is wrong with one path segment: (code suffix, message), or None."""
    if segment == "":
        return "path.empty_segment", "Path contains an empty or non-string segment"
    size = len(segment.encode())
    if size > MAX_SEGMENT_BYTES:
        return ("path.segment_too_long",
                f"Path segment of {size} bytes exceeds maximum of {MAX_SEGMENT_BYTES}")
    if segment in PROTO_SEGMENTS:
        return "path.proto_polluted", f"Path segment '{segment}' is not allowed (prototype pollution)."
    return None


@functools.lru_cache(maxsize=4096)
def _segment(segment: str) -> tuple[bytes, bool, tuple[str, str] | None]:
    """A segment as update.lua gets it (escaped JSON string), whether it holds a bracket or
    brace (a key with one ends the codec's fast skip), and its problem. Cached: the same few
    field names come again and again."""
    return codec.encode_compact(segment), not _BRACKETS.isdisjoint(segment), _segment_problem(segment)


def _path_arg(name: str, index: int, segments: list[str]) -> tuple[bytes, bool, OpError | None]:
    """A path as update.lua takes it (escaped segments joined by NUL; "" for the root),
    whether a segment holds a bracket or brace, and the path's problem."""
    if len(segments) > MAX_PATH_DEPTH:
        return b"", False, OpError(index, f"{name}.path.too_deep",
                                   f"Path depth {len(segments)} exceeds maximum of {MAX_PATH_DEPTH}")
    infos = [_segment(segment) for segment in segments]
    for _, _, problem in infos:
        if problem is not None:
            return b"", False, OpError(index, f"{name}.{problem[0]}", problem[1])
    return b"\0".join(info[0] for info in infos), any(info[1] for info in infos), None


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


# A value that is already compact JSON as the store writes it, with no bracket or brace in a
# string: a small integer, a short printable ASCII string without escapes, true, false, null.
_SIMPLE_VALUE = re.compile(rb'0|-?[1-9][0-9]{0,17}|"[ !#-Z^-z|~]{0,64}"|true|false|null')


def _value_arg(op: SetOp | MergeOp | AppendOp, index: int,
               max_value_bytes: int) -> tuple[bytes, bool, OpError | None]:
    """An op's value as update.lua gets it (compact JSON), whether its strings are plain, and
    the merge value's problem."""
    if op.value is UNSET:
        return b"null", True, None
    raw = bytes(op.value)
    if len(raw) <= max_value_bytes and _SIMPLE_VALUE.fullmatch(raw) and not isinstance(op, MergeOp):
        return raw, True, None
    field = f"ops[{index}].value"
    tree = _decode(raw, field)
    error = merge_value_error(index, tree) if isinstance(op, MergeOp) else None
    value = codec.compact_from_tree(tree, field, max_value_bytes)
    return value, codec.plain_strings(value), error


def op_steps(op: Op) -> int:
    """One op's steps (MAX_CALL_STEPS): a merge value's keys are counted up to
    MAX_MERGE_KEYS (past that the op is an op error and is not sent)."""
    segments, _ = segments_of(op)
    steps = max(1, len(segments))
    if isinstance(op, MergeOp):
        # (not an object: the op error merge.value.not_an_object, nothing sent)
        with contextlib.suppress(msgspec.DecodeError):
            steps += min(len(_TOP_LEVEL.decode(bytes(op.value))), MAX_MERGE_KEYS)
    return steps


def check_steps(ops: list[Op], path: str, total: int = 0) -> int:
    """`total` plus the steps of `ops` (`path`: where they are, `$.ops`), within
    MAX_CALL_STEPS, else CALL_TOO_LARGE naming `path`; the new total."""
    total += sum(map(op_steps, ops))
    if total > MAX_CALL_STEPS:
        raise CallTooLarge(
            f"{path}: the ops take {total} steps of update work by here (an op 1, each level "
            "of its path past the first 1, each key of a merge value 1), more than the limit "
            f"of {MAX_CALL_STEPS} for one call; nothing was written: split them over several "
            "calls", {"path": path, "size": total, "limit": MAX_CALL_STEPS})
    return total


class EncodedOps(Struct):
    """update.lua's ARGV tail (plain flag, count, 3 per op) for the ops that pass the checks,
    the errors of the rest, and the request index of each op sent (the script names an op
    by its position among those sent)."""

    args: list[bytes | str | int]
    errors: list[OpError]
    sent: list[int]


def encode_ops(ops: list[Op], max_value_bytes: int) -> EncodedOps:
    """The ops as update.lua takes them (EncodedOps)."""
    if len(ops) > MAX_OPS:
        raise InvalidRequest(f"$.ops: at most {MAX_OPS} ops per update, got {len(ops)}",
                             {"path": "$.ops", "limit": MAX_OPS})
    check_steps(ops, "$.ops")
    args: list[bytes | str | int] = []
    errors: list[OpError] = []
    sent: list[int] = []
    plain = True
    for index, op in enumerate(ops):
        name = _NAMES[type(op)]
        segments, array_form = segments_of(op)
        path, bracket, error = _path_arg(name, index, segments)
        plain = plain and not bracket
        if isinstance(op, IncrementOp):
            value: bytes | str = str(op.by)
        elif isinstance(op, DecrementOp):
            value = str(-op.by)
        elif isinstance(op, _WITH_VALUE) and error is None:
            value, plain_value, error = _value_arg(op, index, max_value_bytes)
            plain = plain and plain_value
        else:
            value = b""
        if error is not None:
            errors.append(error)
            continue
        kind = "append_array" if array_form and isinstance(op, AppendOp) else name
        args += [kind, path, value]
        sent.append(index)
    return EncodedOps(["1" if plain else "", len(sent), *args], errors, sent)


def _decode(text: bytes, field: str) -> Any:
    try:
        return codec.decode_exact(text)
    except ValueError as exc:
        raise InvalidRequest(f"$.{field}: not valid JSON: {exc}", {"path": f"$.{field}"}) from exc


def _labels(op: Op) -> tuple[str, str]:
    """How messages name an op's path: the path ("root", a field, or "[a, b]" for append),
    and the place a type mismatch names (append: the leaf)."""
    segments, _ = segments_of(op)
    if not segments:
        return "root", "root"
    if isinstance(op, AppendOp):
        return "[" + ", ".join(segments) + "]", segments[-1]
    return segments[0], segments[0]


def script_error(op: Op, index: int, code: str, detail: str) -> OpError:
    """An error that update.lua found, with its message (the script returns the op index, the
    code and the JSON type that the message names)."""
    name = _NAMES[type(op)]
    label, place = _labels(op)
    problem = code.rpartition(".")[2]
    if code == "append.value_not_string":
        return OpError(index, "append.type_mismatch",
                       f"Expected string append value at path '{place}', got {detail}.")
    if code == "append.type_mismatch":
        message = (f"Cannot append at path '{place}': target is {detail}, expected array, "
                   "string, null, or missing field.")
    elif problem == "target_not_object":
        message = f"Cannot {name} at path '{label}': target is {detail}, expected object."
    elif problem == "not_number":
        message = f"Expected number at path '{label}', got {detail}."
    else:  # out_of_range
        message = (f"Result of {name} at path '{label}' is outside the 64-bit signed integer "
                   "range.")
    return OpError(index, code, message)


def merge_errors(ops: list[Op], encoded: EncodedOps, reply: UpdateReply,
                 docs_url: str) -> list[OpError]:
    """Errors from the checks and from the script, by op index, each with its `doc_url` under
    `docs_url`. The script's are flat (op position, code, detail); a reply recorded by an
    older version for a call retried now (`reply.positions` false) has (op index, code,
    message) instead."""
    applied, positions, from_script = reply.op_errors, reply.positions, []
    for i in range(0, len(applied), 3):
        code, detail = applied[i + 1].decode(), applied[i + 2].decode()
        if not positions:
            from_script.append(OpError(int(applied[i]), code, detail))
            continue
        index = encoded.sent[int(applied[i])]
        from_script.append(script_error(ops[index], index, code, detail))
    found = sorted(encoded.errors + from_script, key=lambda e: e.op_index)
    for error in found:
        error.doc_url = doc_url(error.code, docs_url)
    return found
