"""Every function the service serves has a spec, and every spec has its typed methods (a
client one and an in-process one) and its row in the README's function table."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from stateworker import StateClient, StateStore, specs
from stateworker.engines import catalog
from stateworker.specs import Spec, typed_methods
from stateworker.state import functions

README = Path(__file__).resolve().parents[2] / "README.md"
EVERY: tuple[Spec, ...] = (*specs.NATIVE, *catalog.SPECS)


def readme_table() -> list[str]:
    text = README.read_text()
    start = text.index("<!-- the function table")
    return text[start:text.index("<!-- end of the function table -->")].splitlines()[1:]


def missing_methods(cls: type, every: tuple[Spec, ...]) -> list[str]:
    """The native specs without a typed method on `cls`, or with one of another name; and
    the methods whose spec is not one of `every`."""
    methods = typed_methods(cls)
    found = [f"{spec.name}: no typed method {spec.method!r} on {cls.__name__}"
             for spec in every if spec.engine == "state" and methods.get(spec.method) != spec]
    return found + [f"{cls.__name__}.{name}: its spec {spec.name!r} is not served"
                    for name, spec in methods.items() if spec not in every]


def test_the_served_functions_are_the_specs() -> None:
    assert list(functions.NATIVE.functions) == [spec.name for spec in specs.NATIVE]
    assert list(catalog.CATALOG.functions) == [spec.name for spec in EVERY]
    assert {spec.name for spec in specs.NATIVE if spec.read_only} == functions.READS
    assert catalog.CATALOG.reads == {spec.name for spec in EVERY if spec.read_only}
    assert {spec.name for spec in specs.NATIVE if spec.scoped} == functions.SCOPED
    assert all(spec.engine in ("moco", "dagu") for spec in catalog.SPECS)


def test_every_native_function_has_a_typed_method_on_both_faces() -> None:
    assert missing_methods(StateClient, EVERY) == []
    assert missing_methods(StateStore, EVERY) == []


def test_a_function_without_a_typed_method_is_caught() -> None:
    extra = Spec("state::frobnicate", "frobnicate", msgspec.Struct, None, "frobnicate")
    assert missing_methods(StateClient, (*EVERY, extra)) == [
        "state::frobnicate: no typed method 'frobnicate' on StateClient"]
    assert missing_methods(StateStore, specs.NATIVE[1:]) == [
        "StateStore.get: its spec 'state::get' is not served"]


def test_every_function_any_engine_has_a_typed_call_of_its_spec() -> None:
    # `typed(spec, request)` (both faces) encodes `spec.request` and decodes `spec.result`:
    # each must be a type msgspec can take, a Struct for the request.
    for spec in EVERY:
        assert issubclass(spec.request, msgspec.Struct), spec.name
        msgspec.json.Decoder(spec.result)
        msgspec.json.Decoder(spec.request)
    assert {spec.name for spec in EVERY} <= set(StateStore.catalog.functions)


def test_every_error_a_spec_names_has_one_text() -> None:
    for spec in specs.NATIVE:
        text = specs.raises_text(spec, specs.Face("call", "CallTimeout (TIMEOUT): ..."))
        assert text.count("\n") == len(spec.raises) + 1, spec.name
        for code in spec.raises:
            assert f"({code}): " in text
    for spec in catalog.SPECS:
        assert set(spec.raises) <= set(specs._WHY), spec.name


def test_the_readme_has_one_row_per_function_as_its_spec_says() -> None:
    assert readme_table() == specs.table(EVERY)
    rows = [row for row in readme_table() if row.startswith("| `")]
    names = [re.match(r"\| `([^`]+)`", row).group(1) for row in rows]  # type: ignore[union-attr]
    assert names == [spec.name for spec in EVERY]
