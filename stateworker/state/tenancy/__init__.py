"""Who a caller is and what is theirs: principals and roles in Redis, with their ACL users
(principals.py), and private namespaces with their claimed scopes (namespaces.py). The
caches every call is decided by are the core's (core/access.py, core/claims.py).

Imports the core and reactive (a principal's and a namespace's triggers).
"""
