"""What the state service serves: the native `state::*` functions and every engine's, with
the option every native function takes (KeeperHub's isolation)."""

from __future__ import annotations

from stateworker.engines import dagu, keeperhub, moco
from stateworker.state.functions import FUNCTIONS, READS, Catalog

CATALOG = Catalog({**FUNCTIONS, **moco.FUNCTIONS, **dagu.FUNCTIONS, **keeperhub.FUNCTIONS},
                  READS | moco.READS | dagu.READS | keeperhub.READS, keeperhub.REWRITE)
# What an in-process `StateStore.call` serves (stateworker/__init__.py gives it to every
# StateStore): the native functions only, with their options as on the bus.
IN_PROCESS = Catalog(FUNCTIONS, READS, keeperhub.REWRITE)
