"""The workflow engines' front-ends: their function names, shapes and rules, translated into
the native `state::*` functions. Each engine has its room, with the same modules (a module
an engine has nothing for is absent): `__init__.py` its `SERVED` and `SPECS`, `specs.py` its
functions' specs, `schemas.py` its request and result shapes, `rules.py` its names, checks
and texts, `functions.py` its functions over the native ones. `common.py` is what every
engine needs; `catalog.py` joins them."""
