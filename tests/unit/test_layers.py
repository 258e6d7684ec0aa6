"""Imports point one way: leaf -> transport -> events -> state | bus -> reactive -> app.

A module may import its own layer and the layers below it; `state` and `bus` never import each
other (the bus serves any service; the state service is one of them). Inside `engines`, an
engine's room (`engines/moco/` ...) imports no other engine's; only `catalog.py` joins them.
The package's public face (`stateworker/__init__.py`, `__main__.py`) sits on top.
docs/architecture.md has the picture and says where each kind of change goes.
"""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

RANKS = {"leaf": 0, "transport": 1, "events": 2, "state": 3, "bus": 3, "reactive": 4,
         "snapshot": 4, "engines": 4, "app": 5, "top": 6}
SUBPACKAGES = ("transport", "events", "state", "bus", "reactive", "snapshot", "engines", "app")
ROOT = Path(str(resources.files("stateworker")))
PACKAGES = frozenset(".".join(("stateworker", *init.parent.relative_to(ROOT).parts))
                     for init in ROOT.rglob("__init__.py"))
ENGINES_JOINED = "stateworker.engines.catalog"  # the one engines module that imports every room


def layer_of(module: str) -> str:
    """The layer of a module of the package, by its dotted name."""
    parts = module.split(".")
    if parts[:1] != ["stateworker"]:
        raise ValueError(module)
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return "top"
    return parts[1] if parts[1] in SUBPACKAGES else "leaf"


def imported(source: str, module: str) -> list[str]:
    """Every stateworker module a source imports (at any depth, TYPE_CHECKING included)."""
    names = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from stateworker.state import writes` imports the module stateworker.state.writes
            names += [f"{base}.{alias.name}" if _is_package(base) else base
                      for alias in node.names]
    return [n for n in names if n.split(".")[0] in ("stateworker", "benchmarks", "tests")]


def _is_package(dotted: str) -> bool:
    return dotted in PACKAGES


def engine_of(module: str) -> str | None:
    """The engine whose room a module is in (`stateworker.engines.moco.rules`: moco); None
    for any other module (engines/common.py and catalog.py are every engine's)."""
    parts = module.split(".")
    if parts[:2] != ["stateworker", "engines"] or len(parts) < 3:
        return None
    room = ".".join(parts[:3])
    return parts[2] if room in PACKAGES else None


def violations(source: str, module: str) -> list[str]:
    mine = layer_of(module)
    found = []
    for name in imported(source, module):
        if not name.startswith("stateworker"):
            found.append(f"{module} imports {name}, which is outside the installed package")
            continue
        theirs = layer_of(name)
        sideways = {mine, theirs} == {"state", "bus"}
        if RANKS[theirs] > RANKS[mine] or sideways:
            found.append(f"{module} ({mine}) imports {name} ({theirs})")
        elif mine == "engines" and module != ENGINES_JOINED and \
                engine_of(name) not in (None, engine_of(module)):
            found.append(f"{module} imports {name}: an engine's room imports no other engine's")
    return found


def package_modules() -> dict[str, str]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        dotted = ".".join(("stateworker", *path.relative_to(ROOT).with_suffix("").parts))
        modules[dotted.removesuffix(".__init__") if path.name == "__init__.py"
                and path.parent != ROOT else dotted] = path.read_text()
    return modules


def test_every_import_points_down() -> None:
    modules = package_modules()
    assert len(modules) > 30 and {layer_of(m) for m in modules} >= set(SUBPACKAGES) | {"leaf"}
    problems = [v for module, source in modules.items() for v in violations(source, module)]
    assert problems == []


def test_a_wrong_import_is_caught() -> None:
    assert violations("from stateworker.state import writes\n", "stateworker.bus.runtime") == [
        "stateworker.bus.runtime (bus) imports stateworker.state.writes (state)"]
    assert violations("import stateworker.app.cli\n", "stateworker.keys") == [
        "stateworker.keys (leaf) imports stateworker.app.cli (app)"]
    assert violations("def f():\n    from stateworker.bus import client\n",
                      "stateworker.transport.plans") == [
        "stateworker.transport.plans (transport) imports stateworker.bus.client (bus)"]
    assert violations("from benchmarks import bench\n", "stateworker.app.cli") == [
        "stateworker.app.cli imports benchmarks, which is outside the installed package"]
    assert violations("from ..transport.plans import Plan\n", "stateworker.state.writes") == []
    assert violations("from stateworker.events.model import Event\n",
                      "stateworker.state.api") == []


def test_an_engines_room_imports_no_other_engines() -> None:
    assert violations("from stateworker.engines.dagu import rules\n",
                      "stateworker.engines.moco.functions") == [
        "stateworker.engines.moco.functions imports stateworker.engines.dagu.rules: an "
        "engine's room imports no other engine's"]
    assert violations("from stateworker.engines.keeperhub.rules import isolated\n",
                      "stateworker.engines.common") == [
        "stateworker.engines.common imports stateworker.engines.keeperhub.rules: an "
        "engine's room imports no other engine's"]
    assert violations("from stateworker.engines.moco import rules, schemas\n"
                      "from stateworker.engines.common import renamed\n",
                      "stateworker.engines.moco.functions") == []
    assert violations("from stateworker.engines import dagu, keeperhub, moco\n",
                      ENGINES_JOINED) == []
    assert violations("from stateworker.engines.keeperhub import rules\n",
                      "stateworker.state.functions") == [
        "stateworker.state.functions (state) imports stateworker.engines.keeperhub.rules "
        "(engines)"]
