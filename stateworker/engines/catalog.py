"""What the state service serves: the native `state::*` functions and every engine's, with
the option every native function takes (KeeperHub's isolation)."""

from __future__ import annotations

from stateworker.engines import dagu, keeperhub, moco
from stateworker.specs import Spec
from stateworker.state.functions import NATIVE

ENGINES = (moco, dagu, keeperhub)
SPECS: tuple[Spec, ...] = tuple(spec for engine in ENGINES for spec in engine.SPECS)
# What the bus service serves, and an in-process `StateStore` alike (stateworker/__init__.py
# gives it to every StateStore): the native functions with their options, and the engines'.
CATALOG = NATIVE.joined(tuple(entry for engine in ENGINES for entry in engine.SERVED),
                        keeperhub.REWRITE)
