"""Loads the Lua scripts as one Redis function library and expands their includes.

Every `lua/<name>.lua` becomes the function `<library>_<name>`, called with FCALL. The library
is loaded once (FUNCTION LOAD); its top level runs once, so the include helpers are made once
and not on every call, which is what an EVAL script costs (a closure per helper per call: a
tenth of an update's time in Redis).

Layout of the library:
    #!lua name=<library>
    local KEYS, ARGV        -- set by each function's entry point: the scripts read them
    <status table ST>       -- from errors.py
    <every include, once>   -- `--- @include "name"`: lua/includes/name.lua, its own first
    do                      -- one block per script (its locals stay its own)
      <the script's part above `--- @per-call`, if it has one: made once>
      local function run() <the rest: runs on every call> end
      redis.register_function{function_name = ..., callback = ..., flags = ...}
    end
A script's shebang `#!lua flags=no-writes` becomes its function's flags. Top-level locals above
`--- @per-call` live as long as the library: a script that keeps per-call state there resets it
at the start of each call. The library's name carries a digest of its source, so services of
different versions can share one Redis; a call that finds its function missing (a restart
without persistence, FUNCTION FLUSH) loads the library again and is repeated (plans.pipeline).
Which scripts there are, and the KEYS and ARGV each takes, is said by their bindings
(bindings.py) and checked here against each script's header (`check_header`); an FCALL is
written only by `Library.fcall`, which only a binding calls.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Generic, NamedTuple, TypeVar

from stateworker.errors import ScriptError, shown
from stateworker.scripts.statuses import lua_status_table, script_reply
from stateworker.transport.connection import RedisConnection
from stateworker.transport.wire import Arg

R = TypeVar("R")  # a binding's reply tuple

_INCLUDE = re.compile(r'^--- @include "([A-Za-z0-9_-]+)"\s*$', re.MULTILINE)
_PER_CALL = re.compile(r"^--- @per-call\s*$", re.MULTILINE)
_FLAGS = re.compile(r"^#!lua flags=([a-z,-]+)\s*$")

_NAME_MARK = "@@LIBRARY@@"  # stands for the library's name until its digest is known


def _read(relative: str) -> str:
    path = resources.files("stateworker").joinpath("scripts", "lua", relative)
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


def _script_block(name: str, function: str) -> str:
    """One script as a block of the library: made once, its per-call part wrapped in run()."""
    source = _read(f"{name}.lua")
    flags = ""
    first, _, rest = source.partition("\n")
    shebang = _FLAGS.match(first)
    if shebang:
        source = rest
        flags = ", flags = {" + ", ".join(f"'{f}'" for f in shebang.group(1).split(",")) + "}"
    if "@include" in _INCLUDE.sub("", source):
        raise ScriptError(f"lua/{name}.lua: a malformed --- @include line")
    source = _INCLUDE.sub("", source)  # the includes are already in the library, once
    parts = _PER_CALL.split(source)
    if len(parts) > 2:
        raise ScriptError(f"lua/{name}.lua: more than one --- @per-call line")
    once, per_call = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])
    return (f"do\n{once}\nlocal function run()\n{per_call}\nend\n"
            f"redis.register_function{{function_name = '{function}', callback = "
            f"function(keys, args) KEYS, ARGV = keys, args return run() end{flags}}}\n"
            "end\n")


@dataclass(frozen=True, slots=True)
class Signature:
    """What a script takes: the most KEYS, its fixed ARGV, whether any number more follow
    them (`tail`) and whether answer.lua's may come last (`answers`)."""
    keys: int
    args: int
    tail: bool = False
    answers: bool = False


@dataclass(frozen=True, slots=True)
class Header:
    """A script's header (its opening comment's `Input:` section) read: its Signature, the
    name of each fixed ARGV and how many ARGV answer.lua's are (`last`)."""
    signature: Signature
    names: dict[int, str]
    last: int

    def admits(self, count: int) -> bool:
        """Whether a call of `count` ARGV fits the header."""
        sig = self.signature
        extra = count - sig.args
        return extra >= 0 if sig.tail else extra == 0 or (sig.answers and extra == self.last)


# Header lines: KEYS[i] or KEYS[i..j]; ARGV[i], ARGV[i..j], ARGV[i..] (a tail: any number) or,
# in answer.lua, ARGV[n-i] (counted from the last, n = #ARGV); `@arguments <include>` takes
# the include's Input section first (answer: last).
_HEADER_KEYS = re.compile(r"KEYS\[(\d+)(?:\.\.(\d+))?\]")
_HEADER_ARGV = re.compile(r"ARGV\[([^\]]*)\]([^\n]*?)(?=ARGV\[|KEYS\[|$)", re.MULTILINE)
_ARGV_INDEX = re.compile(r"(?:(\d+)(?:\.\.(\d*))?|n(?:-(\d+))?)")
_ARGUMENTS = re.compile(r"@arguments ([a-z]+)")
_INPUT = re.compile(r"^( *)Input\b[^\n]*:\n((?:\1 +[^\n]*\n|\n)*)", re.MULTILINE)


def _input(name: str, source: str) -> str:
    """The `Input:` section of a Lua file's header (the lines indented under it)."""
    found = _INPUT.search(source.split("]]", 1)[0] + "\n")
    if found is None:
        raise ScriptError(f"lua/{name}.lua: its header has no Input: section")
    return found.group(2)


def read_header(name: str, source: str) -> Header:
    """A script's header read (includes/<x>.lua's Input section for `@arguments x`)."""
    section = _input(name, source)
    uses = _ARGUMENTS.findall(section)
    for include in uses:
        section = _input(f"includes/{include}", _read(f"includes/{include}.lua")) + section
    keys = [int(m.group(2) or m.group(1)) for m in _HEADER_KEYS.finditer(section)]
    if not keys:
        raise ScriptError(f"lua/{name}.lua: its header names no KEYS[i]")
    names: dict[int, str] = {}
    tail: set[int] = set()
    last: set[int] = set()
    for ref in _HEADER_ARGV.finditer(section):
        index = _ARGV_INDEX.fullmatch(ref.group(1))
        if index is None:
            raise ScriptError(f"lua/{name}.lua: its header's ARGV[{ref.group(1)}] is none of "
                              "ARGV[i], ARGV[i..j], ARGV[i..], ARGV[n-i]")
        first, end, back = index.groups()
        if first is None:
            last.add(int(back or 0))
        elif end == "":
            tail.add(int(first))
        else:
            for i in range(int(first), int(end or first) + 1):
                names.setdefault(i, " ".join(ref.group(2).split()))
    args = len(names)
    if set(names) != set(range(1, args + 1)) or tail not in (set(), {args + 1}) \
            or last != set(range(len(last))):
        raise ScriptError(f"lua/{name}.lua: its header's ARGV are not ARGV[1] on, one after "
                          f"another (fixed {sorted(names)}, tail from {sorted(tail)}, from the "
                          f"last n-{sorted(last)})")
    answers = "answer" in uses
    return Header(Signature(max(keys), args, bool(tail), answers), names,
                  len(last) if answers else 0)


def check_header(name: str, source: str, binding: Signature) -> Header:
    """`source`'s header read; a binding that disagrees with it raises ScriptError, naming the
    first argument the two count differently."""
    header = read_header(name, source)
    declared, where = header.signature, f"lua/{name}.lua"
    if declared.keys != binding.keys:
        raise ScriptError(f"{where} declares {declared.keys} KEYS in its header, its binding "
                          f"passes up to {binding.keys}")
    if declared.args != binding.args:
        first = min(declared.args, binding.args) + 1
        raise ScriptError(f"{where} declares {declared.args} ARGV in its header, its binding "
                          f"passes {binding.args}: ARGV[{first}] "
                          f"({header.names.get(first, 'not in the header')})")
    for says, takes, what in ((declared.tail, binding.tail, f"ARGV[{declared.args + 1}..]"),
                              (declared.answers, binding.answers, "answer.lua's ARGV last")):
        if says != takes:
            raise ScriptError(f"{where}: its header {'declares' if says else 'has no'} {what}, "
                              f"its binding {'passes them' if takes else 'does not'}")
    return header


def assemble_library(scripts: Mapping[str, Signature]) -> tuple[str, str]:
    """(library name, library source) of `scripts` (name -> what its binding passes, checked
    against each script's header)."""
    for name, signature in scripts.items():
        check_header(name, _read(f"{name}.lua"), signature)
    wanted = "".join(f'--- @include "{n}"\n' for name in scripts
                     for n in _INCLUDE.findall(_read(f"{name}.lua")))
    shared = _expand(wanted, (), set())
    blocks = "".join(_script_block(name, f"{_NAME_MARK}_{name}") for name in scripts)
    source = (f"#!lua name={_NAME_MARK}\n"
              "local KEYS, ARGV -- the running call's, set by its function's entry point\n"
              + lua_status_table() + shared + blocks)
    if source.count(_NAME_MARK) != 1 + len(scripts):
        raise ScriptError(f"a Lua file contains {shown(_NAME_MARK)}")
    # The name is a digest of the whole text: another text (another version) is another library.
    library = f"stateworker_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    return library, source.replace(_NAME_MARK, library)


def _load_failure(library: str, reply: Exception) -> str:
    """Why Redis refused the library, in words a user can act on."""
    text = str(reply)
    if "unknown command" in text.lower() or "unknown subcommand" in text.lower():
        cause = "this Redis has no functions: stateworker needs Redis 7.0 or newer"
    elif text.startswith("OOM"):
        cause = "Redis is out of memory (maxmemory reached)"
    elif text.startswith("READONLY"):
        cause = "this Redis is a read-only replica: point stateworker at the primary"
    elif text.startswith(("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")):
        cause = "Redis is not ready (loading its data, busy or without its primary)"
    else:
        cause = "Redis refused it"
    return f"loading the Lua library {library} failed: {cause}: {text}"


FCALL = "FCALL"  # written here only; the service's ACL rule names it (app/service_user.py)


class Library:
    """The package's scripts as one function library, for one connection."""

    def __init__(self, conn: RedisConnection, scripts: Mapping[str, Signature]) -> None:
        self.conn = conn
        self.names = tuple(scripts)
        self.library, self.source = assemble_library(scripts)
        self.functions = {name: f"{self.library}_{name}" for name in scripts}

    def fcall(self, name: str, keys: Sequence[Arg], args: Sequence[Arg]) -> list[Arg]:
        """FCALL of script `name` (called by its binding only: Binding.command)."""
        return [FCALL, self.functions[name], len(keys), *keys, *args]

    async def load(self) -> None:
        """Load the library (again); a refusal names its cause."""
        reply = (await self.conn.pipeline([["FUNCTION", "LOAD", "REPLACE", self.source]]))[0]
        if isinstance(reply, Exception):
            raise ScriptError(_load_failure(self.library, reply))


class Held(NamedTuple):
    """How PostgreSQL comes to hold what a script writes: a write that runs no entry script
    sends its kept reply there only once it holds every write of its steps (state/core/
    once.py, snapshot/kept.py). `kind` "stream": through the stream KEYS[key] the snapshot
    follows (a partition's events; the registry, copied whole); "marked": KEYS[key] stays in
    the set KEYS[mark] until the snapshot stored it (a barrier); "none": nothing it must hold
    (a read; an index build, which a restore makes again from the definitions). A script
    without one (`Binding.held` None: the live settings) writes what PostgreSQL never holds."""

    kind: str
    key: int = 0
    mark: int = 0


@dataclass(frozen=True, slots=True)
class Binding(Generic[R]):
    name: str  # lua/<name>.lua
    keys: int  # the most KEYS the script takes (its header's highest KEYS[i])
    args: int  # its fixed ARGV (its header's ARGV[1..args])
    reply: Callable[[list[Any]], R]  # its reply tuple's `read`
    tail: bool = False  # any number of ARGV more (its header's ARGV[args + 1..])
    answers: bool = False  # answer_args may come last (its header's `@arguments answer`)
    held: Held | None = None  # how PostgreSQL holds its writes (None: never)

    @property
    def signature(self) -> Signature:
        return Signature(self.keys, self.args, self.tail, self.answers)

    def command(self, library: Library, keys: Sequence[Arg], args: Sequence[Arg]) -> list[Arg]:
        """The FCALL of this script on `library`."""
        return library.fcall(self.name, keys, args)

    def read(self, raw: Any) -> R:
        """Its reply, checked (statuses.script_reply) and typed."""
        return self.reply(script_reply(raw, self.name))
