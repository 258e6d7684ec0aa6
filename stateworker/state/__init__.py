"""The state service's operations, in families stacked one way (tests/unit/test_layers.py
holds the order; each family's docstring says what it owns):

    (this package)  the function table (functions.py) and the native typed functions
                    (typed_functions.py), the Python API (api.py, keyvalue.py), opening
                    and closing (lifecycle.py), the TTL reaper (expiry.py), the dataset's
                    generation markers (generation.py), the console's files (uifiles.py)
    query/, tenancy/    queries and indexes; principals and private namespaces
    kv/, reactive/      keys and values; triggers, leases and barriers
    core/               RedisState, the caches every call is decided by, the checks

A family imports its own modules and those of lower rows, never a family of its own row.
"""
