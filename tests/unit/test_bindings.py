"""Every script call goes through its binding: only scripts/library.py writes an FCALL, only a
`Binding` asks for one, and every Lua file has exactly one binding whose KEYS count is its
header's."""

from __future__ import annotations

import ast
from importlib import resources

from stateworker.scripts.bindings import BINDINGS
from stateworker.scripts.library import header_keys
from tests.unit.test_layers import package_modules

LIBRARY = "stateworker.scripts.library"
BINDING = "stateworker.scripts.bindings"
ROUTER = "stateworker.transport.slots"  # names FCALL to find its keys; never writes one


def script_calls(source: str, module: str) -> list[str]:
    """What in `source` calls a script without its binding: an FCALL (any case) written as
    text, a call of the library's `fcall`, or a read of its function names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value.upper() in ("FCALL", "FCALL_RO") and module not in (LIBRARY, ROUTER)):
            found.append(f"{module}:{node.lineno} writes {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "fcall" and module not in (
                LIBRARY, BINDING):
            found.append(f"{module}:{node.lineno} calls the library's fcall")
        elif (isinstance(node, ast.Attribute) and node.attr == "functions"
              and isinstance(node.value, ast.Attribute) and node.value.attr == "library"):
            found.append(f"{module}:{node.lineno} reads the library's function names")
    return found


def test_only_a_binding_calls_a_script() -> None:
    modules = package_modules()
    assert LIBRARY in modules and BINDING in modules
    assert [found for module, source in modules.items()
            for found in script_calls(source, module)] == []


def test_a_script_call_outside_its_binding_is_caught() -> None:
    inline = 'commands.append(["FCALL", state.library.functions["advance"], 2, *keys])\n'
    assert script_calls(inline, "stateworker.reactive.dispatcher") == [
        "stateworker.reactive.dispatcher:1 writes 'FCALL'",
        "stateworker.reactive.dispatcher:1 reads the library's function names"]
    assert script_calls("state.library.fcall('advance', keys, args)\n",
                        "stateworker.snapshot.snapshotter") == [
        "stateworker.snapshot.snapshotter:1 calls the library's fcall"]
    assert script_calls("ADVANCE.command(state.library, *call)\n",
                        "stateworker.reactive.trimming") == []


def test_every_lua_file_has_exactly_one_binding_with_its_header_keys() -> None:
    root = resources.files("stateworker").joinpath("scripts", "lua")
    files = {p.name.removesuffix(".lua"): p.read_text() for p in root.iterdir()
             if p.name.endswith(".lua")}
    names = [binding.name for binding in BINDINGS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(files)
    for binding in BINDINGS:
        assert header_keys(binding.name, files[binding.name]) == binding.keys, binding.name
