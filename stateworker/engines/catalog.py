"""What the state service serves: the native `state::*` functions and every engine's, with
the option every native function takes (KeeperHub's isolation); and the in-process store that
serves the same (`stateworker.StateStore`)."""

from __future__ import annotations

from stateworker.engines import dagu, keeperhub, moco
from stateworker.specs import Spec
from stateworker.state import api
from stateworker.state.functions import NATIVE

ENGINES = (moco, dagu, keeperhub)
SPECS: tuple[Spec, ...] = tuple(spec for engine in ENGINES for spec in engine.SPECS)
# What the bus service serves, and the in-process store below alike: the native functions
# with their options, and the engines'.
CATALOG = NATIVE.joined(tuple(entry for engine in ENGINES for entry in engine.SERVED),
                        keeperhub.REWRITE)


class StateStore(api.StateStore):
    """The state store serving what the bus service serves (`from stateworker import
    StateStore`): the engines' functions by `call`, KeeperHub's isolation on the native ones,
    and the roles' families knowing every function."""

    catalog = CATALOG
