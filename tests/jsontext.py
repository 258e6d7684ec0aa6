"""Hypothesis strategies for JSON *text*, and an independent reference canonical form.

A document is generated as a tree whose numbers are their exact text (`Num`), so the test
knows what every digit must look like after a round trip.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import strategies as st


class Num(str):
    """A JSON number kept as its text."""


class Obj(list):  # type: ignore[type-arg]
    """A JSON object as an ordered list of (key, value) pairs (keys unique)."""


def _num_text() -> st.SearchStrategy[Num]:
    ints = st.integers(min_value=-(2**70), max_value=2**70).map(str)
    near_2_53 = st.integers(min_value=2**53 - 3, max_value=2**53 + 3).map(str)
    frac = st.tuples(
        st.integers(-(10**12), 10**12), st.text("0123456789", min_size=1, max_size=6)
    ).map(lambda t: f"{t[0]}.{t[1]}")
    trailing = st.tuples(st.integers(0, 999), st.integers(1, 4)).map(
        lambda t: f"{t[0]}.{'1' + '0' * t[1]}")
    exp = st.tuples(
        st.integers(-999, 999), st.sampled_from(["e", "E"]), st.sampled_from(["", "+", "-"]),
        st.integers(0, 300),
    ).map(lambda t: f"{t[0]}{t[1]}{t[2]}{t[3]}")
    return st.one_of(ints, near_2_53, frac, trailing, exp).map(Num)


strings = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(
        ["<", ">", "&", "\u2028", "\u2029", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f",
         "\x7f", '"', "\\", "é", "😀"]),
    max_size=12,
)
scalars = st.one_of(st.none(), st.booleans(), _num_text(), strings)


def _objects(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Obj]:
    return st.dictionaries(strings, children, max_size=5).map(lambda d: Obj(d.items()))


json_trees = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), _objects(children)),
    max_leaves=40,
)


def deep(depth: int) -> Any:
    tree: Any = Num("1")
    for i in range(depth):
        tree = [tree] if i % 2 else Obj([("d", tree)])
    return tree


def to_text(tree: Any, space: str = "") -> str:
    """JSON text of a tree, keys in their order, with `space` around punctuation."""
    if isinstance(tree, Num):
        return str(tree)
    if isinstance(tree, Obj):
        items = [f"{space}{json.dumps(k, ensure_ascii=False)}{space}:{space}{to_text(v, space)}"
                 for k, v in tree]
        return "{" + ",".join(items) + space + "}"
    if isinstance(tree, list):
        return "[" + ",".join(space + to_text(v, space) for v in tree) + space + "]"
    return json.dumps(tree, ensure_ascii=False)


_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_U_ESCAPED = {"<", ">", "&", "\u2028", "\u2029"}


def go_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif ord(ch) < 0x20 or ch in _U_ESCAPED:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def reference_canonical(tree: Any) -> bytes:
    """The canonical form as docs/architecture.md defines it, written independently of codec.py."""
    def walk(node: Any) -> str:
        if isinstance(node, Num):
            return str(node)
        if isinstance(node, Obj):
            last = dict(node)  # a duplicate key: the last one wins
            keys = sorted(last, key=lambda k: k.encode())
            return "{" + ",".join(f"{go_string(k)}:{walk(last[k])}" for k in keys) + "}"
        if isinstance(node, list):
            return "[" + ",".join(walk(v) for v in node) + "]"
        if isinstance(node, str):
            return go_string(node)
        return json.dumps(node)

    return walk(tree).encode()


def reference_hash(tree: Any) -> str:
    return hashlib.sha256(reference_canonical(tree)).hexdigest()


def exact_load(text: bytes | str) -> Any:
    """Parse JSON keeping number text, key order and the [] / {} distinction."""
    return json.loads(text, parse_float=Num, parse_int=Num, parse_constant=Num,
                      object_pairs_hook=Obj)


def normalize(tree: Any) -> Any:
    """A tree in the shape exact_load gives (dedupe nothing; tuples to lists)."""
    if isinstance(tree, Obj):
        return Obj([(k, normalize(v)) for k, v in tree])
    if isinstance(tree, list):
        return [normalize(v) for v in tree]
    return tree
