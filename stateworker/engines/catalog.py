"""What the state service serves: the native `state::*` functions and every engine's, with
the option every native function takes (KeeperHub's isolation)."""

from __future__ import annotations

from stateworker.engines import dagu, keeperhub, moco
from stateworker.specs import Spec
from stateworker.state.functions import NATIVE

ENGINES = (moco, dagu, keeperhub)
SPECS: tuple[Spec, ...] = tuple(spec for engine in ENGINES for spec in engine.SPECS)
CATALOG = NATIVE.joined(tuple(entry for engine in ENGINES for entry in engine.SERVED),
                        keeperhub.REWRITE)
# What an in-process `StateStore` serves (stateworker/__init__.py gives it to every
# StateStore): the native functions only, with their options as on the bus.
IN_PROCESS = NATIVE.joined((), keeperhub.REWRITE)
