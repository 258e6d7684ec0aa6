"""moco's State Store Activities (`builtin.state.*`): `schemas.py` their `input_data` and
results, `rules.py` moco's checks, namespaces and texts, `functions.py` the activities over
the native functions. docs/moco.md is the user's guide."""

from stateworker.engines.moco.functions import FUNCTIONS, READS

__all__ = ["FUNCTIONS", "READS"]
