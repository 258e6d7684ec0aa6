"""Dagu's state executor actions (`state.*`): `schemas.py` a step's `with:` fields and the
actions' outputs, `rules.py` Dagu's scopes, checks and texts, `functions.py` the actions over
the native functions. docs/dagu.md is the user's guide."""

from stateworker.engines.dagu.functions import FUNCTIONS, READS

__all__ = ["FUNCTIONS", "READS"]
