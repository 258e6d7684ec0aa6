"""The state that reactions are made of: the trigger registry (triggers.py), leased triggers
(trigger_leases.py) and barriers, fan-in gates (barrier.py). The dispatcher that acts on
them is `stateworker.reactive`, a layer above.

Imports the core only.
"""
