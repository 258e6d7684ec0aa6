"""KeeperHub's workflow state: its guarantees are options of the native functions, not
functions of its own (docs/keeperhub.md). `rules.py` is its one rule that is not a native
check: `isolation: "workflow"`, a rewrite of every native function's body (`REWRITE`)."""

from stateworker.engines.keeperhub.rules import MARKER, isolated
from stateworker.specs import Spec
from stateworker.state.functions import Rewrite, Served

SPECS: tuple[Spec, ...] = ()  # (none of its own: a KeeperHub step is a native call)
SERVED: tuple[Served, ...] = ()
REWRITE = Rewrite(MARKER, isolated)

__all__ = ["REWRITE", "SERVED", "SPECS"]
