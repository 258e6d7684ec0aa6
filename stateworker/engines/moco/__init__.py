"""moco's State Store Activities (`builtin.state.*`): `specs.py` the functions' specs,
`schemas.py` their `input_data` and results, `rules.py` moco's checks, namespaces and texts,
`functions.py` the activities over the native functions. docs/moco.md is the user's guide."""

from stateworker.engines.moco.functions import SERVED
from stateworker.engines.moco.specs import SPECS

__all__ = ["SERVED", "SPECS"]
