"""Loads the Lua scripts and expands their includes.

`--- @include "name"` pulls in `lua/includes/name.lua` (once per script; a cycle is an error).
The status table `ST` from errors.py is written in after an optional `#!lua` shebang line.
Scripts are called with EVALSHA (`Script.command`); plans.pipeline loads them again and
repeats the call on NOSCRIPT (Redis restarted, SCRIPT FLUSH): a NOSCRIPT call did not run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from importlib import resources

from stateworker.errors import lua_status_table
from stateworker.redisconn import Arg, RedisConnection

_INCLUDE = re.compile(r'^--- @include "([A-Za-z0-9_-]+)"\s*$', re.MULTILINE)


class ScriptError(Exception):
    """Raised when a Lua file or one of its includes cannot be assembled."""


def _read(relative: str) -> str:
    path = resources.files("stateworker").joinpath("lua", relative)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ScriptError(f"missing Lua file lua/{relative}") from exc


def _expand(source: str, seen: tuple[str, ...], included: set[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            raise ScriptError(f"include cycle: {' -> '.join((*seen, name))}")
        if name in included:
            return ""
        included.add(name)
        return _expand(_read(f"includes/{name}.lua"), (*seen, name), included)

    return _INCLUDE.sub(replace, source)


def assemble(name: str) -> str:
    """The full source of `lua/<name>.lua`: shebang, status table, includes, body."""
    source = _expand(_read(f"{name}.lua"), (name,), set())
    shebang = ""
    if source.startswith("#!"):
        shebang, _, source = source.partition("\n")
        shebang += "\n"
    return shebang + lua_status_table() + source


class Script:
    """One assembled script and its SHA1."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.source = assemble(name)
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    def command(self, keys: Sequence[Arg], args: Sequence[Arg]) -> list[Arg]:
        return ["EVALSHA", self.sha, len(keys), *keys, *args]


SCRIPT_NAMES = (
    "set", "delete", "reap", "list", "update", "sethash", "topic", "deltopic", "entries",
)


class Scripts:
    """Every script of the package, for one connection."""

    def __init__(self, conn: RedisConnection) -> None:
        self.conn = conn
        self.by_name = {name: Script(name) for name in SCRIPT_NAMES}

    def __getitem__(self, name: str) -> Script:
        return self.by_name[name]

    async def load_all(self) -> None:
        await self.conn.pipeline([["SCRIPT", "LOAD", s.source] for s in self.by_name.values()])
