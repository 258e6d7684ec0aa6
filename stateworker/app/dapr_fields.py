"""A native refusal named by the field of the Dapr request it came from (app/dapr.py).

A Dapr request runs as native calls (state::transaction, state::get-many, ...) whose checks
name their own fields: `$.ops[2].value`, `$.keys[0]`, `$.scope`. The Dapr caller sent none of
them: it sent `[4].value` of a save's body, `operations[1].request.key` of a transaction, a key
in the URL. `Fields` maps each native path a request's calls can name to the Dapr field it was
made from, and `renamed` rewrites a refusal's path (in its message and its `details.path`)
through it: in the message where it names the native path, else before it.
(engines/common.py's `renamed_error` renames one `$.`-rooted field to another; a Dapr field
may be rooted at an array, `$[0]`, or not be in the body at all, `key`.)

Dapr paths: `$[i]` an item of a save's body, `$.operations[i].request` a transaction's
operation, `$.keys[i]` a bulk get's key, `$.filter...` a query's filter; `key` and `store` the
URL's, `metadata.<name>` a URL query parameter (as the HTTP face names any query parameter).
"""

from __future__ import annotations

import copy

from stateworker.errors import StateError

OP_FIELDS = {  # a native write op's fields -> the Dapr item's
    "key": "key", "value": "value", "expected_version": "etag", "ttl_ms": "metadata.ttlInSeconds"}


class Fields:
    """Native paths -> the Dapr fields they were made from. A native path not mapped but
    under one that is (`$.ops[0].value.a`) is named under its Dapr field."""

    def __init__(self, **fixed: str) -> None:
        self.paths: dict[str, str] = {f"$.{native}": dapr for native, dapr in fixed.items()}
        self.made: set[str] = set()  # native paths whose value the Dapr field only made

    def add(self, native: str, dapr: str, made: bool = False) -> None:
        """`native` came from Dapr field `dapr`; `made`: not its value but made from it (a
        scope from a key's app), so a refusal keeps saying what the native value was."""
        self.paths[native] = dapr
        if made:
            self.made.add(native)

    def write_op(self, native: str, condition: str, written: str, ttl: str | None) -> None:
        """Native op `native` (`$.ops[0]`): its condition (the op as a whole, its ETag) from
        the Dapr operation at `condition`, its key, value and TTL from the one at `written`
        (the last operation on the key: app/dapr_requests.py `in_order`), its TTL from
        `ttl` (a URL parameter, a transaction's metadata) when not the operation's own."""
        self.paths[native] = condition
        for name, field in OP_FIELDS.items():
            where = condition if name == "expected_version" else written
            self.paths[f"{native}.{name}"] = f"{where}.{field}"
        if ttl is not None:
            self.paths[f"{native}.ttl_ms"] = ttl

    def dapr(self, native: str) -> tuple[str, bool] | None:
        """The Dapr field of native path `native` and whether the refused value is that
        field's (None: it names none of this request's)."""
        cut = len(native)
        while cut > 1:
            head = native[:cut]
            if head in self.paths:
                return self.paths[head] + native[cut:], head not in self.made
            cut = max(head.rfind("."), head.rfind("["))
        return None


def renamed(exc: StateError, fields: Fields) -> StateError:
    """`exc` naming the Dapr field its native path came from (`exc` itself when its path
    is none of `fields`): the path in its message and `details.path` replaced, a native
    op's index (`op_index`, `first_index`: the path says which) left out."""
    native = exc.details.get("path")
    found = fields.dapr(native) if isinstance(native, str) else None
    if found is None or native is None:
        return exc
    dapr, same = found
    bare = native.removeprefix("$.")  # (a size check names its field without `$.`)
    if same and native in exc.message:
        message = exc.message.replace(native, dapr, 1)
    elif same and exc.message.startswith(bare):
        message = dapr + exc.message[len(bare):]
    else:
        message = f"{dapr}: {exc.message}"
    named = copy.copy(exc)  # (its class and code kept: some take the code, OpFailed's)
    named.message, named.args = message, (message,)
    named.details = {**{k: v for k, v in exc.details.items()
                        if k not in ("op_index", "first_index")}, "path": dapr}
    return named
