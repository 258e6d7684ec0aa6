"""`state::ui-content`: a file of the console (stateworker/console_files/, listed in
uicontent.py), as iii's console asks a state worker for its assets. No Redis command: the
plan ends at its first step."""

from __future__ import annotations

from stateworker.context import CallContext
from stateworker.errors import NotFound, shown
from stateworker.schemas import UiContentRequest, UiContentResult
from stateworker.state.core.store import RedisState
from stateworker.transport.plans import Plan
from stateworker.uicontent import known_paths, ui_file


def state_ui_content(state: RedisState, req: UiContentRequest, ctx: CallContext) -> Plan:
    """The file, verbatim, with its content type; NOT_FOUND naming the files there are."""
    found = ui_file(req.path)
    if found is None:
        raise NotFound(f"path: no console file {shown(req.path)}; there are "
                       f"{', '.join(known_paths())}", {"path": "path", "value": req.path})
    content, content_type = found
    result = UiContentResult(content.decode(), content_type)
    return Plan([], lambda _: result)
