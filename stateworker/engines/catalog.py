"""What the state service serves: the native `state::*` functions and every engine's."""

from __future__ import annotations

from stateworker.engines import dagu, moco
from stateworker.state.functions import FUNCTIONS, READS, Catalog

CATALOG = Catalog({**FUNCTIONS, **moco.FUNCTIONS, **dagu.FUNCTIONS},
                  READS | moco.READS | dagu.READS)
