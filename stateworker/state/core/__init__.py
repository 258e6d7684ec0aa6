"""The core of the state service: what every state operation runs with and is checked by.

`RedisState` (store.py: settings, key names, the connection, the script library, how plans
run) and `strict`'s confirmation of a batch (confirm.py); what every replica keeps in memory
and decides each call by, without a round trip: the registry follower (registry.py) and the
two caches it keeps current, the claimed scopes (claims.py) and the principals and roles
(access.py, deciding by the pure rules of grants.py); the request checks every family shares
(validate.py) and `acl` mode's check of each call (guard.py); the typed results of the Python
API (results.py).

The lowest family: it imports no other. The caches live here, not beside what changes them
(tenancy/), because `RedisState` holds them and every family reads them.
"""
