"""The workflow engines' front-ends: their function names, shapes and rules, translated into
the native `state::*` functions (one module per engine; `catalog.py` joins them)."""
