"""Keys and values: an entry's stored form (packed.py) and its upgrade (repack.py); reads
(reads.py), writes (writes.py) and update ops (ops.py) as plans; listing over the scope
indexes (listing.py); bulk reads and writes (bulkread.py, bulk.py); transactions
(transactions.py).

Imports the core only.
"""
