"""Every script call goes through its binding: only scripts/library.py writes an FCALL, only a
`Binding` asks for one, every Lua file has exactly one binding whose KEYS and ARGV are its
header's, and what each script's builder builds fits that header."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from importlib import resources

import pytest

from stateworker.context import Answer, CallContext
from stateworker.errors import ScriptError
from stateworker.keys import KeySpace
from stateworker.scripts import bindings as b
from stateworker.scripts import read_bindings as rb
from stateworker.scripts import upkeep_bindings as ub
from stateworker.scripts.bindings import BINDINGS
from stateworker.scripts.library import check_header, read_header
from stateworker.settings import Settings
from stateworker.transport.wire import Arg
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


def lua_files() -> dict[str, str]:
    root = resources.files("stateworker").joinpath("scripts", "lua")
    return {p.name.removesuffix(".lua"): p.read_text() for p in root.iterdir()
            if p.name.endswith(".lua")}


def test_every_lua_file_has_exactly_one_binding_with_its_header_keys() -> None:
    files = lua_files()
    names = [binding.name for binding in BINDINGS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(files)
    for binding in BINDINGS:
        assert read_header(binding.name, files[binding.name]).signature == binding.signature, \
            binding.name


SETTINGS = Settings(redis_url="redis://h", prefix="sw", partitions=4)
SPACE = KeySpace("sw", 4)
PART = SPACE.for_scope("s")
BUS = CallContext(call_id="c1", call_digest="0" * 40)
ANSWER = Answer(reply=b"r", stream="st", entry_id=b"1-0", group="g", ttl_ms=1, head=b"{")
VALUE = b.Value(json=b"1", hash="h")
UPDATE_OPS: list[Arg] = ["1", 2, "set", "", "1", "increment", "", "2"]  # plain, count, 3 per op


def entry(extra: list[Arg], answer: Answer | None = None) -> b.Call:
    return b.entry_call(SETTINGS, SPACE, "s", "k", BUS, False, extra, answer)


# Every script's call as its builder builds it (the entry scripts': entry_call with their
# own ARGV; those that answer, also with answer_args last).
BUILT: dict[str, Callable[[], list[b.Call]]] = {
    "set": lambda: [entry(e, a) for a in (None, ANSWER)
                    for e in (b.set_args(VALUE, "t", 5, "", False, None),
                              b.set_args(VALUE, b.KEEP, b.KEEP, "a", True, 3))],
    "delete": lambda: [entry(b.delete_args(v), a) for v in (None, 2) for a in (None, ANSWER)],
    "update": lambda: [entry(b.update_args(100, 1, b.KEEP, None, UPDATE_OPS[:2], 3), a)
                       for a in (None, ANSWER)] + [entry(b.update_args(100, None, "t", 5,
                                                                       UPDATE_OPS, None))],
    "topic": lambda: [entry(b.topic_args("t")), entry(b.topic_args(None))],
    "transaction": lambda: [entry(b.transaction_args(SETTINGS, PART, "s", "tx", None, [
        (0, []), (2, ["set", "k", "1", "h", "~", "", "", "", "delete", "j", ""]), (0, [])]))],
    "delprefix": lambda: [entry(b.delprefix_args(PART, "s", b"p", 10, 100))],
    "get": lambda: [b.get_call(SETTINGS, SPACE, "s", "k", BUS, ANSWER, False)],
    "bind": lambda: [*(b.bind_call(SETTINGS, SPACE, BUS, True, mode) for mode in "rb"),
                     b.bind_call(SETTINGS, SPACE, BUS, False, "w", 5, 9),
                     b.kept_call(b.bind_call(SETTINGS, SPACE, BUS, False, "w", 5), b"=1"),
                     b.kept_call(b.bind_call(SETTINGS, SPACE, BUS, False, "w", 5), b"", mode="u"),
                     b.kept_call(b.bind_call(SETTINGS, SPACE, BUS, True, "w", 5), b"=1",
                                 (SPACE.partition(0).unsaved_kept, 10, b"needs"))],
    "sethash": lambda: [b.sethash_call(PART, "s", "k", 1, "h")],
    "reap": lambda: [ub.reap_call(SETTINGS, PART)],
    "list": lambda: [rb.list_call(PART, "s", "keys")],
    "entries": lambda: [rb.entries_call(PART, "s", "i", "key", "asc", b"", "", 10, 0, None,
                                       "k*", None, True, 100)],
    "deltopic": lambda: [b.deltopic_call(SETTINGS, PART, "s", "", "t*", b"[", b"+", 10)],
    "trigger": lambda: [b.trigger_call(SPACE, "del", "t", "", 5, now=1, cap_bytes=9),
                        b.trigger_call(SPACE, "set", "t", "{}", 5, "p", True, now=1, expires=2)],
    "keeptrigger": lambda: [b.keep_trigger_call(SPACE, 1, "t", b"{}", b"{}", 2),
                            ub.reap_triggers_call(SPACE, 1, 10)],
    "claim": lambda: [b.claim_call(SPACE, "p", ["a", "b"], ["", "1:x"], None, 1000, 10000)],
    "release": lambda: [b.release_call(SPACE, "p", False, ["a"])],
    "access": lambda: [b.access_call(SPACE, "principal-set", "n", "{}", ["r"])],
    "barrier": lambda: [b.barrier_call(PART, "b", "k", b"1:2", "n:2", 2, "2", None, 9, None, 5),
                        b.barrier_call(PART, "b", "k", b"1:2", "k:x", 2, "[]", "t", 9,
                                       ["j", "k"], 5)],
    "delbarrier": lambda: [b.delbarrier_call(PART, "b")],
    "forget": lambda: [ub.forget_call("c", ["x", "y"], ["1", ""])],
    "lease": lambda: [ub.lease_call("l", "take", "t", 5)],
    "droptarget": lambda: [ub.droptarget_call("s")],
    "advance": lambda: [ub.advance_call("l", "p", "t", "1-0", 1)],
    "aside": lambda: [ub.aside_call(PART, "t", "x", ("1-0", 1)), ub.aside_call(PART, "t", "x", None)],
    "snapread": lambda: [ub.snapread_call("r", 0)],
    "getmany": lambda: [rb.getmany_call(PART, "s", ["a", "b"], 1000)],
    "index": lambda: [b.index_call(PART, "s", "create", "/n", 5)],
    "repack": lambda: [ub.repack_call(PART, "entries", ["e1"])],
    "stamp": lambda: [ub.stamp_call("h", "h", "g")],
    "pages": lambda: [rb.pages_call(PART, "s", c, "n", "s\0\0c\0 1\0256", 1, 256,
                                   rb.PageBounds(1, 2, 3, 4, 5, 6), "w") for c in (None, "c")],
    "config": lambda: [b.config_call(SPACE, []), b.config_call(SPACE, [("a", "1"), ("b", "")])],
    "snaprows": lambda: [ub.snaprows_call(PART, "1-0", 10, 1 << 20, 10, 1 << 20)],
    "snappage": lambda: [ub.snappage_call("s", "-", 10, 1 << 20)],
    "session": lambda: [ub.session_call(SPACE, "d", "p", b"[]", 5, 16),
                        ub.session_call(SPACE, "d", "p", None)],
    "sweep": lambda: [ub.sweep_call(SPACE.bus_stream("svc"), "svc", "me", 600_000)],
}


def test_every_builder_builds_what_its_script_header_declares() -> None:
    """One ARGV more or less than a script's header declares is refused (`Header.admits`),
    so a builder and its header cannot disagree unseen."""
    files = lua_files()
    assert sorted(BUILT) == sorted(binding.name for binding in BINDINGS)
    for name, build in BUILT.items():
        header = read_header(name, files[name])
        for keys, args in build():
            assert len(keys) <= header.signature.keys or name == "forget", (name, keys)
            assert header.admits(len(args)), (name, len(args), header.signature)
            assert not header.admits(header.signature.args - 1), name
            if not header.signature.tail:
                assert not header.admits(len(args) + 1), name


def test_a_binding_and_a_header_that_disagree_on_an_argv_fail_to_load() -> None:
    files = lua_files()
    source = files["set"]
    one_more = source.replace("    @arguments answer", "    ARGV[16] an argument too many\n"
                              "    @arguments answer")
    one_less = source.replace("    ARGV[15] max live keys", "    max live keys")
    misnamed = source.replace("    ARGV[15] max live keys", "    ARGV[16] max live keys")
    assert one_more != source != one_less != misnamed
    with pytest.raises(ScriptError, match=r"lua/set.lua declares 16 ARGV in its header, its "
                       r"binding passes 15: ARGV\[16\] \(an argument too many\)"):
        check_header("set", one_more, b.SET.signature)
    with pytest.raises(ScriptError, match=r"lua/set.lua declares 14 ARGV in its header, its "
                       r"binding passes 15: ARGV\[15\] \(not in the header\)"):
        check_header("set", one_less, b.SET.signature)
    with pytest.raises(ScriptError, match=r"lua/set.lua: its header's ARGV are not ARGV\[1\] on"):
        check_header("set", misnamed, b.SET.signature)
    for changed in (dataclasses.replace(b.SET.signature, answers=False),
                    dataclasses.replace(b.SET.signature, tail=True)):
        with pytest.raises(ScriptError, match=r"lua/set.lua: its header"):
            check_header("set", source, changed)
    assert check_header("set", source, b.SET.signature).names[15].startswith("max live keys")
