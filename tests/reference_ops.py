"""A plain-Python reference of the `state::update` op rules, on exact JSON trees.

Trees are what `tests.jsontext.exact_load` gives: `Num` (a number as its text), `Obj` (an
ordered list of (key, value) pairs), `list`, `str`, `bool` and `None`. Nothing here shares
code with the product; it follows the written contract only.

An op is a dict shaped like the request's JSON: `{"type": ..., "path": ..., "value": ...,
"by": ...}`; a key that is absent from the dict is absent from the request (`MISSING` is never
stored in an op). `op_text` writes an op as exact JSON text for the request body.
"""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

from tests.jsontext import Num, Obj, to_text

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_PATH_DEPTH = 32
MAX_SEGMENT_BYTES = 256
MAX_MERGE_KEYS = 1024
MAX_MERGE_DEPTH = 16
PROTO = ("__proto__", "constructor", "prototype")
_INT_TEXT = re.compile(r"-?[0-9]+")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""The starting document of a key that does not exist."""

RefError = tuple[int, str, str]  # (op_index, code, message)


class OpFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


# ---- trees -------------------------------------------------------------------------------------
def type_name(node: Any) -> str:
    if node is None:
        return "null"
    if isinstance(node, bool):
        return "boolean"
    if isinstance(node, Num):
        return "number"
    if isinstance(node, str):
        return "string"
    if isinstance(node, Obj):
        return "object"
    if isinstance(node, list):
        return "array"
    raise TypeError(f"not a JSON tree node: {node!r}")


def obj_get(obj: Obj, key: str, default: Any = MISSING) -> Any:
    for k, v in obj:
        if k == key:
            return v
    return default


def obj_put(obj: Obj, key: str, value: Any) -> None:
    """Set `key`: an existing key keeps its position, a new one goes last."""
    for i, (k, _) in enumerate(obj):
        if k == key:
            obj[i] = (key, value)
            return
    obj.append((key, value))


def obj_remove(obj: Obj, key: str) -> None:
    obj[:] = [(k, v) for k, v in obj if k != key]


def depth(node: Any) -> int:
    if isinstance(node, Obj):
        return 1 + max((depth(v) for _, v in node), default=0)
    if isinstance(node, list):
        return 1 + max((depth(v) for v in node), default=0)
    return 0


def dedupe(node: Any) -> Any:
    """A tree with every object's duplicate keys collapsed (the last value wins)."""
    if isinstance(node, Obj):
        out = Obj()
        for k, v in node:
            obj_put(out, k, dedupe(v))
        return out
    if isinstance(node, list):
        return [dedupe(v) for v in node]
    return node


# ---- numbers -----------------------------------------------------------------------------------
def format_float(x: float) -> str:
    text = ""
    for precision in (15, 16, 17):
        text = f"%.{precision}g" % x
        if float(text) == x:
            break
    if not any(c in text for c in ".eEn"):
        text += ".0"
    return text


def add_number(current: Num, by: int) -> Num | None:
    """`current + by` as JSON number text, or None when out of range (or not finite)."""
    text = str(current)
    if _INT_TEXT.fullmatch(text):
        value = int(text)
        if not INT64_MIN <= value <= INT64_MAX:
            return None
        result = value + by
        if not INT64_MIN <= result <= INT64_MAX:
            return None
        return Num(str(result))
    x = float(text) + by
    if not math.isfinite(x):
        return None
    return Num(format_float(x))


# ---- checks that need no document --------------------------------------------------------------
def segments_of(op: dict[str, Any]) -> tuple[list[str], bool]:
    """The literal segments of an op's path, and whether it was given in array form."""
    kind = op["type"]
    if kind in ("merge", "append"):
        path = op.get("path")
        if path is None or path == "":
            return [], False
        if isinstance(path, str):
            return [path], False
        return list(path), True
    path = op["path"]
    return ([] if path == "" else [path]), False


def path_check(name: str, segments: list[str]) -> None:
    if len(segments) > MAX_PATH_DEPTH:
        raise OpFailed(f"{name}.path.too_deep",
                       f"Path depth {len(segments)} exceeds maximum of {MAX_PATH_DEPTH}")
    for segment in segments:
        if segment == "":
            raise OpFailed(f"{name}.path.empty_segment", "Path contains an empty or non-string segment")
        size = len(segment.encode())
        if size > MAX_SEGMENT_BYTES:
            raise OpFailed(f"{name}.path.segment_too_long",
                           f"Path segment of {size} bytes exceeds maximum of {MAX_SEGMENT_BYTES}")
        if segment in PROTO:
            raise OpFailed(f"{name}.path.proto_polluted",
                           f"Path segment '{segment}' is not allowed (prototype pollution).")


def merge_value_check(value: Any) -> None:
    if not isinstance(value, Obj):
        raise OpFailed("merge.value.not_an_object", "Merge value must be a JSON object")
    for count, (key, _) in enumerate(value, start=1):
        if key in PROTO:
            raise OpFailed("merge.value.proto_polluted",
                           f'Merge value top-level key "{key}" is a prototype-pollution sink')
        if count > MAX_MERGE_KEYS:
            raise OpFailed("merge.value.too_many_keys",
                           f"Merge value has more than {MAX_MERGE_KEYS} top-level keys")
    if depth(value) > MAX_MERGE_DEPTH:
        raise OpFailed("merge.value.too_deep",
                       f"Merge value JSON nesting depth exceeds maximum of {MAX_MERGE_DEPTH}")


# ---- the document ------------------------------------------------------------------------------
class _Doc:
    def __init__(self, start: Any) -> None:
        self.fresh = start is MISSING
        self.value: Any = Obj() if start is MISSING else dedupe(copy.deepcopy(start))

    def root_object(self, verb: str, label: str, code: str) -> Obj:
        if not isinstance(self.value, Obj):
            raise OpFailed(code, f"Cannot {verb} at path '{label}': target is "
                                 f"{type_name(self.value)}, expected object.")
        return self.value

    # Each op returns True when it applied, False when it did nothing (no error), or raises.
    def set(self, segments: list[str], value: Any) -> bool:
        if not segments:
            self.value = value
            return True
        obj = self.root_object("set", segments[0], "set.target_not_object")
        obj_put(obj, segments[0], value)
        return True

    def remove(self, segments: list[str]) -> bool:
        if not segments:
            self.value = None
            return True
        obj = self.root_object("remove", segments[0], "remove.target_not_object")
        obj_remove(obj, segments[0])
        return True

    def add(self, name: str, segments: list[str], by: int) -> bool:
        delta = by if name == "increment" else -by
        label = segments[0] if segments else "root"
        out_of_range = OpFailed(
            f"{name}.out_of_range",
            f"Result of {name} at path '{label}' is outside the 64-bit signed integer range.")
        if not segments and self.fresh:
            result = add_number(Num("0"), delta)
            if result is None:
                raise out_of_range
            self.value = result
            return True
        if segments:
            obj = self.root_object(name, label, f"{name}.target_not_object")
            current = obj_get(obj, segments[0])
        else:
            current = self.value
        if current is MISSING:
            current = Num("0")
        if not isinstance(current, Num):
            raise OpFailed(f"{name}.not_number",
                           f"Expected number at path '{label}', got {type_name(current)}.")
        result = add_number(current, delta)
        if result is None:
            raise out_of_range
        if segments:
            obj_put(obj, segments[0], result)
        else:
            self.value = result
        return True

    def merge(self, segments: list[str], value: Obj) -> bool:
        if not segments:
            target = self.root_object("merge", "root", "merge.target_not_object")
        else:
            if not isinstance(self.value, Obj):
                self.value = Obj()
            target = self.value
            for seg in segments:
                child = obj_get(target, seg)
                if not isinstance(child, Obj):
                    child = Obj()
                    obj_put(target, seg, child)
                target = child
        for key, item in value:
            obj_put(target, key, copy.deepcopy(item))
        return True

    def append(self, segments: list[str], array_form: bool, value: Any) -> bool:
        if not segments:
            target = None if self.fresh else self.value
            self.value = _appended(target, value, "root")
            return True
        if not isinstance(self.value, Obj):
            full = "[" + ", ".join(segments) + "]"
            raise OpFailed("append.target_not_object", f"Cannot append at path '{full}': target is "
                                                       f"{type_name(self.value)}, expected object.")
        obj = self.value
        for seg in segments[:-1]:
            child = obj_get(obj, seg)
            if not isinstance(child, Obj):
                child = Obj()
                obj_put(obj, seg, child)
            obj = child
        leaf = segments[-1]
        current = obj_get(obj, leaf)
        if current is MISSING or current is None:
            if array_form or len(segments) > 1 or type_name(value) != "string":
                obj_put(obj, leaf, [value])
            else:
                obj_put(obj, leaf, value)
            return True
        obj_put(obj, leaf, _appended(current, value, leaf))
        return True


def _appended(target: Any, value: Any, label: str) -> Any:
    kind = type_name(target)
    if kind == "null":
        return value if type_name(value) == "string" else [value]
    if kind == "string":
        if type_name(value) != "string":
            raise OpFailed("append.type_mismatch", f"Expected string append value at path '{label}', "
                                                   f"got {type_name(value)}.")
        return str(target) + str(value)
    if kind == "array":
        return [*target, value]
    raise OpFailed("append.type_mismatch", f"Cannot append at path '{label}': target is {kind}, "
                                           "expected array, string, null, or missing field.")


def apply_ops(start: Any, ops: list[dict[str, Any]]) -> tuple[Any, list[RefError], bool]:
    """Apply `ops` to `start` (a tree, or MISSING); (new value, errors, written).

    `written` is whether the entry is written (the key was missing or an op applied); when it
    is not, the new value is the old value.
    """
    doc = _Doc(start)
    errors: list[RefError] = []
    applied = False
    for index, op in enumerate(ops):
        kind = op["type"]
        try:
            segments, array_form = segments_of(op)
            path_check(kind, segments)
            value = copy.deepcopy(dedupe(op.get("value")))
            if kind == "merge":
                merge_value_check(value)
            if kind == "set":
                ok = doc.set(segments, value)
            elif kind == "remove":
                ok = doc.remove(segments)
            elif kind in ("increment", "decrement"):
                ok = doc.add(kind, segments, op["by"])
            elif kind == "merge":
                ok = doc.merge(segments, value)
            elif kind == "append":
                ok = doc.append(segments, array_form, value)
            else:
                raise ValueError(f"unknown op type {kind!r}")
        except OpFailed as failed:
            errors.append((index, failed.code, failed.message))
            continue
        if ok:
            applied = True
            doc.fresh = False
    written = start is MISSING or applied
    return (doc.value if written else start), errors, written


# ---- request text ------------------------------------------------------------------------------
def op_text(op: dict[str, Any]) -> str:
    """An op as exact JSON text (values keep their number text, key order, [] vs {})."""
    parts = []
    for key, item in op.items():
        if key == "path":
            text = json.dumps(item, ensure_ascii=False)
        elif key == "by":
            text = str(int(item))
        elif key == "type":
            text = json.dumps(item)
        else:
            text = to_text(item)
        parts.append(f"{json.dumps(key)}:{text}")
    return "{" + ",".join(parts) + "}"


def update_body(scope: str, key: str, ops: list[dict[str, Any]]) -> bytes:
    return (f'{{"scope":{json.dumps(scope)},"key":{json.dumps(key)},'
            f'"ops":[{",".join(op_text(op) for op in ops)}]}}').encode()
