"""Queries on values: `where` and the index order (predicates.py, pure code), the query's
pages (query.py) and the value indexes that serve them (indexes.py).

Imports the core and kv.
"""
