"""docs/architecture.md stays a map a newcomer can read, and stays true: at most 450 lines, every
module path it names exists, every decision record it lists (docs/decisions/) exists and is
listed, and its "Key layout" has a row for each name keys.py builds. Paths are resolved inside
the repository only.

How the doc names a path: in full from the repository's root (`stateworker/__init__.py`,
`tests/unit/test_layers.py`, `benchmarks/browser.py`, `docs/errors.md`), from the package
(`bus/runtime.py`, `app/cli/parser.py`), or from `stateworker/scripts/` (`lua/includes/packed.lua`).
A bare module name (`reads.py`) must be some module of the repository; in the first column of
"Moving parts" it is the module of the directory named first in its row (`events/model.py`,
`reader.py`), or of the package when the row names none (`settings.py`, `keys.py`). A path with a
placeholder (`scripts/lua/<name>.lua`) must have its directory up to the placeholder.
"""

from __future__ import annotations

import re
from pathlib import Path

from stateworker.keys import KeySpace, PartitionKeys

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
DECISIONS = ROOT / "docs" / "decisions"
PACKAGE = ROOT / "stateworker"
BASES = (ROOT, PACKAGE, PACKAGE / "scripts")  # the doc's three ways of naming a path
MAX_LINES = 450
SEARCHED = ("stateworker", "tests", "benchmarks")  # where a bare module name may live

EXT = r"(?:py|lua|md|sql)"
SEGMENT = r"[\w<>*-]+"
# a path with at least one directory: `bus/runtime.py`, `app/cli/`, `scripts/lua/<name>.lua`
PATH = re.compile(rf"(?<![\w./<>:~-])((?:{SEGMENT}/)+(?:{SEGMENT}\.{EXT})?)(?![\w/])")
# a bare module name: `reads.py`, `uicontent.py's`
BARE = re.compile(r"(?<![\w./<>-])([\w-]+\.(?:py|lua))(?![\w/])")
RECORD_LINK = re.compile(r"\]\(((?:docs/)?decisions/[^)\s]+)\)")
RECORD_NUMBER = re.compile(r"\bdecision (\d{4})\b")


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def resolves(path: str) -> bool:
    """Whether a path the doc names exists under one of its bases (a placeholder's directory
    for a templated path)."""
    if ".." in path.split("/"):
        return False  # the doc names paths inside the repository only
    if any(c in path for c in "<>*"):
        path = path[: re.search(r"[<>*]", path).start()].rsplit("/", 1)[0] + "/"
        if path == "/":
            return True
    for base in BASES:
        target = (base / path).resolve()
        if ROOT not in (target, *target.parents):
            continue  # never outside the repository
        if target.is_dir() if path.endswith("/") else target.is_file():
            return True
    return False


def without_links(text: str) -> str:
    """The text less its links' targets (relative to docs/: checked on their own)."""
    return re.sub(r"\]\([^)\s]+\)", "]", text)


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in PATH.finditer(without_links(text))]


def bare_modules(text: str) -> list[str]:
    return [m.group(1) for m in BARE.finditer(without_links(text))]


def module_exists(name: str) -> bool:
    """Whether some module (or, for `x/`, some directory) of that name is in the repository."""
    wanted = name.rstrip("/")
    return any(p.is_dir() == name.endswith("/")
               for top in SEARCHED for p in (ROOT / top).rglob(wanted))


def path_exists(path: str) -> bool:
    """A path the doc names; a lone directory (`moco/` in "engines: moco/, dagu/") may be any
    directory of that name in the repository, as its context says where."""
    return resolves(path) or (path.count("/") == 1 and path.endswith("/") and module_exists(path))


def moving_parts_rows(text: str) -> list[str]:
    """The first column of every row of "Moving parts"."""
    section = text.split("\n## Moving parts\n", 1)[1].split("\n## ", 1)[0]
    return [line.split(" | ", 1)[0] for line in section.splitlines() if line.startswith("| `")]


def test_the_doc_is_a_map_of_at_most_450_lines():
    lines = doc_text().splitlines()
    assert len(lines) <= MAX_LINES, (
        f"docs/architecture.md has {len(lines)} lines (at most {MAX_LINES}): move the why into a "
        "record in docs/decisions/ and keep the map")


def test_every_path_it_names_exists():
    text = doc_text()
    paths = named_paths(text)
    assert len(paths) > 100, "the path pattern no longer finds the doc's paths"
    missing = sorted({p for p in paths if not path_exists(p)})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_bare_module_name_it_names_exists():
    names = bare_modules(doc_text())
    missing = sorted({n for n in names if not module_exists(n)})
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_moving_parts_names_modules_where_they_are():
    missing = []
    for cell in moving_parts_rows(doc_text()):
        base = "stateworker/"
        for item in re.findall(r"`([^`]+)`", cell):
            if "/" in item:
                base = item if item.endswith("/") else item.rsplit("/", 1)[0] + "/"
                base = base if base.startswith(("stateworker/", "benchmarks/", "tests/")) else (
                    f"stateworker/{base}")
                continue  # checked as a path
            if not resolves(base + item):
                missing.append(f"{base}{item}")
    assert len(moving_parts_rows(doc_text())) > 30
    assert not missing, f"\"Moving parts\" names modules that are not where it says: {missing}"


def test_the_path_patterns_see_what_the_doc_writes():
    sample = ("`bus/runtime.py`, `reads.py` (lua/includes/packed.lua, state/packed.py); "
              "`scripts/lua/<name>.lua` and `app/cli/`; 1..shards-1, calls/s, and/or")
    assert named_paths(sample) == ["bus/runtime.py", "lua/includes/packed.lua", "state/packed.py",
                                   "scripts/lua/<name>.lua", "app/cli/"]
    assert bare_modules(sample) == ["reads.py"]
    assert resolves("bus/runtime.py") and resolves("lua/includes/packed.lua")
    assert resolves("tests/unit/test_layers.py") and resolves("scripts/lua/<name>.lua")
    assert not resolves("bus/nowhere.py") and not resolves("../README.md")


def test_the_key_layout_has_a_row_for_each_name_keys_py_builds():
    """"Key layout" is the one map of the Redis names (keys.py points to it, and holds no copy):
    a name a KeySpace holds or builds for a partition is the first column of a row of it (a
    partition's as any partition's: the doc shows barriers in partition 7)."""
    space = KeySpace("sw", 16)
    part = space.partition(3)
    names = [v for k, v in vars(space).items() if isinstance(v, str) and k[0] != "_" and k != "prefix"]
    names += [getattr(part, f) for f in PartitionKeys.__dataclass_fields__
              if f not in ("tag", "entry_prefix")]
    names += [part.snapshots, part.index_builds, part.unsaved_calls, part.unsaved_kept,
              part.key_index("<scope>"), part.updated_index("<scope>"), part.topic_index("<scope>"),
              part.index_defs("<scope>"), part.snapshot("<cursor>"), part.barrier("<barrier id>"),
              part.call_records("<slice>"), space.bus_stream("<service>")]
    block = doc_text().split("\n## Key layout\n", 1)[1].split("```")[1]
    rows = {re.sub(r"\{sw:p\d+\}", "{sw:p3}", line.split("  ", 1)[0])
            for line in block.splitlines() if line.startswith("sw:")}
    assert len(names) > 40
    missing = sorted(set(names) - rows)
    assert not missing, f"docs/architecture.md's \"Key layout\" has no row for {missing}"


def test_every_decision_record_it_links_exists_and_every_record_is_listed():
    text = doc_text()
    linked = {(DOC.parent / link).resolve() for link in RECORD_LINK.findall(text)}
    missing = sorted(str(p.relative_to(ROOT)) for p in linked if not p.is_file())
    assert not missing, f"docs/architecture.md links records that do not exist: {missing}"
    records = set(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    assert records, "docs/decisions/ holds no record"
    unlisted = sorted(p.name for p in records - linked)
    assert not unlisted, f"records missing from docs/architecture.md's Decisions: {unlisted}"
    numbers = {p.name[:4] for p in records}
    unknown = sorted(set(RECORD_NUMBER.findall(text)) - numbers)
    assert not unknown, f"docs/architecture.md names decisions that do not exist: {unknown}"


def test_every_record_has_its_sections_and_is_in_the_index():
    index = (DECISIONS / "README.md").read_text(encoding="utf-8")
    for record in sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md")):
        text = record.read_text(encoding="utf-8")
        assert text.startswith(f"# {record.name[:4]}. "), record.name
        for heading in ("## Context", "## Decision", "## Consequences"):
            assert f"\n{heading}\n" in text, f"{record.name} lacks {heading}"
        assert f"]({record.name})" in index, f"docs/decisions/README.md does not list {record.name}"
