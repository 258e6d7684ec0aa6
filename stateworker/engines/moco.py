"""moco's State Store Activities (`builtin.state.*`) over the native state functions."""

from __future__ import annotations

from stateworker.state.functions import Prepare

FUNCTIONS: dict[str, Prepare] = {}
READS: frozenset[str] = frozenset()
