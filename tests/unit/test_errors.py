"""The status table is one table: every ST.<code> a script names exists in
scripts.statuses.LUA_STATUS."""

from __future__ import annotations

import re
from importlib import resources

from stateworker.error_codes import HTTP_STATUS
from stateworker.errors import ERROR_CLASSES
from stateworker.scripts.bindings import BINDINGS
from stateworker.scripts.library import assemble_library
from stateworker.scripts.statuses import LUA_STATUS, OUTCOME_STATUSES, STATUS_ERRORS, lua_status_table

SCRIPTS = {b.name: b.signature for b in BINDINGS}
SCRIPT_NAMES = tuple(SCRIPTS)


def lua_sources() -> dict[str, str]:
    root = resources.files("stateworker").joinpath("scripts", "lua")
    files = {f"{p.name}": p.read_text() for p in root.iterdir() if p.name.endswith(".lua")}
    files.update({f"includes/{p.name}": p.read_text()
                  for p in root.joinpath("includes").iterdir() if p.name.endswith(".lua")})
    return files


def test_every_status_a_script_names_is_in_the_python_table() -> None:
    for name, source in lua_sources().items():
        for code in re.findall(r"\bST\.([A-Z_]+)", source):
            assert code in LUA_STATUS, f"{name} names ST.{code}, missing from LUA_STATUS"


def test_every_status_is_an_outcome_or_maps_to_its_error_class() -> None:
    assert len(set(LUA_STATUS.values())) == len(LUA_STATUS)
    for code, number in LUA_STATUS.items():
        if code in OUTCOME_STATUSES:
            assert number not in STATUS_ERRORS
            continue
        assert STATUS_ERRORS[number].code == code
        assert ERROR_CLASSES[code] is STATUS_ERRORS[number]


def test_the_library_carries_the_table_once_and_every_script_as_a_function() -> None:
    library, source = assemble_library(SCRIPTS)
    lines = source.splitlines()
    assert lines[0] == f"#!lua name={library}"
    assert source.count(lua_status_table().strip()) == 1
    assert "--- @include" not in source and "--- @per-call" not in source
    for include in ("entry", "records", "json", "numbers", "text", "glob"):  # each made once
        # (an include's own includes are expanded where it names them: each part once)
        for part in re.split(r"^--- @include .*\n", lua_sources()[f"includes/{include}.lua"],
                             flags=re.MULTILINE):
            assert source.count(part) == 1, include
    for name in SCRIPT_NAMES:
        flags = ", flags = {'no-writes'}" if name in ("list", "entries", "getmany", "snaprows",
                                                      "snappage") else (
            # (the scripts that may answer their call: its reply list in another slot)
            ", flags = {'allow-cross-slot-keys'}" if name in ("set", "get", "delete", "update")
            else "")
        assert (f"function_name = '{library}_{name}', callback = function(keys, args) "
                f"KEYS, ARGV = keys, args return run() end{flags}}}") in source


def test_every_script_file_is_loaded_and_has_a_header() -> None:
    names = {n[:-4] for n in lua_sources() if "/" not in n}
    assert names == set(SCRIPT_NAMES)
    for name, source in lua_sources().items():
        assert "--[[" in source.split("\n", 3)[0] + source.split("\n", 3)[1], name
        if "/" not in name:
            for part in ("Input:", "Output:", "Events:"):
                assert part in source, f"{name} header lacks {part}"


def test_every_error_code_has_its_http_status() -> None:
    """The HTTP face maps each code (error_codes.HTTP_STATUS); a code added without one would
    answer 500 over HTTP."""
    assert set(HTTP_STATUS) == set(ERROR_CLASSES)
    assert all(400 <= status <= 599 for status in HTTP_STATUS.values())
