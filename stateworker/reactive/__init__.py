"""The reactive half: the trigger dispatcher, its partition leases and the event trimmer.

It sits above `state/` and `bus/` (it evaluates barriers through the store and appends handler
calls to services' bus streams) and below `app/`, which runs it inside `stateworker serve`.
"""
