"""The console's files (stateworker/console_files/, package data): one table of what is
served, for both faces that serve them: the HTTP face's `/console/` (app/console.py) and the
function `state::ui-content {path}` (iii's content function of its console: `{content,
content_type}`, the file verbatim). A leaf: no I/O but reading the package's own files."""

from __future__ import annotations

import functools
from importlib import resources

# path -> (file, content type). The HTTP face asks for "" (the page), "console.js" ...;
# iii's console config names assets under the worker's own folder ("state/page.js").
# The scripts, in the page's order (console.js's start runs once they all have).
SCRIPTS = ("console_json.js", "console.js", "console_overview.js", "console_keys.js",
           "console_entry.js", "console_tail.js")
FILES = {"": ("console.html", "text/html; charset=utf-8"),
         "console.html": ("console.html", "text/html; charset=utf-8"),
         "console.css": ("console.css", "text/css; charset=utf-8"),
         **{name: (name, "text/javascript; charset=utf-8") for name in SCRIPTS}}
_FOLDERS = ("state/", "console/")  # prefixes a path may carry


def known_paths() -> list[str]:
    return sorted(f"state/{name}" for name in FILES if name)


def normal(path: str) -> str:
    """A path as the table keys it: without a leading `/`, `state/` or `console/`."""
    path = path.strip("/")
    for folder in _FOLDERS:
        path = path.removeprefix(folder)
    return path


_STYLE = b'<link rel="stylesheet" href="/console/console.css">'


def _script_tag(name: str) -> bytes:
    return f'<script src="/console/{name}"></script>'.encode()


@functools.cache
def console_page() -> bytes:
    """The page as the HTTP face serves it: its style and script inlined (two round trips
    fewer before the first keys show), made once."""
    html = _read("console.html")
    assert _STYLE in html, "console.html no longer links its style"
    html = html.replace(_STYLE, b"<style>\n" + _read("console.css") + b"</style>")
    for name in SCRIPTS:
        assert _script_tag(name) in html, f"console.html no longer links {name}"
        html = html.replace(_script_tag(name), b"<script>\n" + _read(name) + b"</script>")
    return html


@functools.cache
def _read(name: str) -> bytes:
    """A file of the package, read once (they change only with the package)."""
    return resources.files("stateworker").joinpath("console_files", name).read_bytes()


def ui_file(path: str) -> tuple[bytes, str] | None:
    """A console file's bytes and content type; None: no such file."""
    found = FILES.get(normal(path))
    if found is None:
        return None
    name, content_type = found
    return _read(name), content_type
