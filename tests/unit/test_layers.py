"""Imports point one way: leaf -> transport -> scripts -> events -> state | bus -> reactive |
engines -> snapshot -> app.

A module may import its own layer and the layers of a lower rank, never one of the same rank:
`state` and `bus` never import each other (the bus serves any service; the state service is
one of them), nor do `reactive` and `engines`; `snapshot` sits above `reactive` (it follows the
streams with reactive's leases), so reactive never imports it. The package's public face
(`stateworker/__init__.py`, `__main__.py`) sits on top. docs/architecture.md has the picture
and says where each kind of change goes. Inside `engines`, an
engine's room (`engines/moco/` ...) imports no other engine's; only `catalog.py` joins them.
Inside `state`, the families stack (stateworker/state/__init__.py): core, then kv and
reactive, then query and tenancy, then the package's own modules (the function table, the API).
"""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

RANKS = {"leaf": 0, "transport": 1, "scripts": 2, "events": 3, "state": 4, "bus": 4,
         "reactive": 5, "engines": 5, "snapshot": 6, "app": 7, "top": 8}
SUBPACKAGES = ("transport", "scripts", "events", "state", "bus", "reactive", "snapshot", "engines",
               "app")
ROOT = Path(str(resources.files("stateworker")))
PACKAGES = frozenset(".".join(("stateworker", *init.parent.relative_to(ROOT).parts))
                     for init in ROOT.rglob("__init__.py"))
ENGINES_JOINED = "stateworker.engines.catalog"  # the one engines module that imports every room
# Inside `state`, families stack (stateworker/state/__init__.py): a family imports its own
# modules and lower ranks' only; "" is the package's own modules, on top.
FAMILY_RANKS = {"core": 0, "kv": 1, "reactive": 1, "query": 2, "tenancy": 2, "": 3}


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
            # `from stateworker.state import writes` imports the module stateworker.state.kv.writes
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
        sideways = theirs != mine and RANKS[theirs] == RANKS[mine]
        if RANKS[theirs] > RANKS[mine] or sideways:
            found.append(f"{module} ({mine}) imports {name} ({theirs})")
        elif mine == "state" and theirs == "state" and (wrong := _across_families(module, name)):
            found.append(wrong)
        elif mine == "engines" and module != ENGINES_JOINED and \
                engine_of(name) not in (None, engine_of(module)):
            found.append(f"{module} imports {name}: an engine's room imports no other engine's")
    return found


def family_of(module: str) -> str:
    """The family of a module of `stateworker.state` (`stateworker.state.kv.writes`: kv); ""
    for the package's own modules (the function table, the API, lifecycle)."""
    parts = module.split(".")
    return parts[2] if len(parts) >= 3 and ".".join(parts[:3]) in PACKAGES else ""


def _across_families(module: str, name: str) -> str | None:
    mine, theirs = family_of(module), family_of(name)
    if mine == theirs:
        return None
    if FAMILY_RANKS[theirs] > FAMILY_RANKS[mine]:
        return f"{module} (state/{mine or '.'}) imports {name} (state/{theirs or '.'}), a family above"
    if FAMILY_RANKS[theirs] == FAMILY_RANKS[mine]:
        return f"{module} (state/{mine}) imports {name} (state/{theirs}), a family beside it"
    return None


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
    assert violations("from stateworker.state.kv import writes\n", "stateworker.bus.runtime") == [
        "stateworker.bus.runtime (bus) imports stateworker.state.kv.writes (state)"]
    assert violations("import stateworker.app.cli\n", "stateworker.keys") == [
        "stateworker.keys (leaf) imports stateworker.app.cli (app)"]
    assert violations("def f():\n    from stateworker.bus import client\n",
                      "stateworker.transport.plans") == [
        "stateworker.transport.plans (transport) imports stateworker.bus.client (bus)"]
    assert violations("from benchmarks import bench\n", "stateworker.app.cli") == [
        "stateworker.app.cli imports benchmarks, which is outside the installed package"]
    assert violations("from ...transport.plans import Plan\n", "stateworker.state.kv.writes") == []
    assert violations("from stateworker.events.model import Event\n",
                      "stateworker.state.api") == []
    assert violations("from stateworker.snapshot import status\n",
                      "stateworker.reactive.status") == [
        "stateworker.reactive.status (reactive) imports stateworker.snapshot.status (snapshot)"]
    assert violations("from stateworker.engines import catalog\n",
                      "stateworker.reactive.dispatcher") == [
        "stateworker.reactive.dispatcher (reactive) imports stateworker.engines.catalog (engines)"]
    assert violations("from stateworker.state.core import store\n",
                      "stateworker.scripts.bindings") == [
        "stateworker.scripts.bindings (scripts) imports stateworker.state.core.store (state)"]


def test_the_state_families_stack() -> None:
    modules = package_modules()
    families = {family_of(m) for m in modules if m.startswith("stateworker.state")}
    assert families == set(FAMILY_RANKS)  # every family ranked, no rank without a family
    assert violations("from stateworker.state.kv import reads\n",
                      "stateworker.state.core.store") == [
        "stateworker.state.core.store (state/core) imports stateworker.state.kv.reads "
        "(state/kv), a family above"]
    assert violations("from stateworker.state.reactive.triggers import live\n",
                      "stateworker.state.kv.writes") == [
        "stateworker.state.kv.writes (state/kv) imports stateworker.state.reactive.triggers "
        "(state/reactive), a family beside it"]
    assert violations("from stateworker.state import functions\n",
                      "stateworker.state.query.query") == [
        "stateworker.state.query.query (state/query) imports stateworker.state.functions "
        "(state/.), a family above"]
    assert violations("from stateworker.state.core import store, validate\n"
                      "from stateworker.state.kv import reads\n",
                      "stateworker.state.query.indexes") == []


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    """module -> the package modules it imports (type-only imports included)."""
    return {module: {name for name in imported(source, module) if name in modules}
            for module, source in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle: the strongly connected groups of more than one module (or a
    module importing itself), each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph[node]:
                    found.append(sorted(group))
    return found


def test_no_import_circle() -> None:
    assert circles(import_graph(package_modules())) == []


def test_an_import_circle_is_caught() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["e"]]


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
