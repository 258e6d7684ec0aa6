"""Dagu's state executor actions (`state.*`): `specs.py` the functions' specs, `schemas.py` a
step's `with:` fields and the actions' outputs, `rules.py` Dagu's scopes, checks and texts,
`functions.py` the actions over the native functions. docs/dagu.md is the user's guide."""

from stateworker.engines.dagu.functions import SERVED
from stateworker.engines.dagu.specs import SPECS

__all__ = ["SERVED", "SPECS"]
