"""PostgreSQL tables read in pages bounded in rows and in bytes (a restore's reads: the
entries, the call records, the barriers), each page from the primary key where the one before
ended: a page of large values is never more than about PAGE_BYTES in memory or in one Redis
pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from stateworker.snapshot.generation import PgConnection

# A page: rows read from PostgreSQL in one query and written back in one Redis
# pipeline, at most, and about as many bytes (of the column that may be large: a value of up
# to max_value_bytes, a call record holding its reply, a barrier's payload of 2 MiB). 1,000 rows
# alone held up to ~1 GiB in the restore's memory and in one pipeline (Redis's query buffer);
# 8 MiB is what the snapshot's batches hold (rows.BATCH_BYTES), a page a few ms of Redis's time.
PAGE_ROWS = 1000
PAGE_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Paged:
    """A table read in pages (`pages`): `columns` selected, the first `keys` of them its
    primary key after `prefix` (the order), `size` the bytes of a row, `where` what else
    selects a row (its parameters passed to `pages`)."""

    table: str
    columns: str
    keys: int
    size: str
    where: str = "TRUE"

    def query(self, first: bool) -> str:
        order = ", ".join(c.strip() for c in self.columns.split(",")[:self.keys])
        after = "" if first else f" AND ({order}) > ({', '.join(['%s'] * self.keys)})"
        # (each row's bytes before it in the page: a row is taken while they are under the
        # budget, so the page ends after the row that reaches it, and holds one row at least)
        return (f"SELECT {self.columns} FROM (SELECT {self.columns}, sum({self.size}) OVER "
                f"(ORDER BY {order} ROWS UNBOUNDED PRECEDING) - ({self.size}) AS before "
                f"FROM {self.table} WHERE prefix = %s AND {self.where}{after} "
                f"ORDER BY {order} LIMIT %s) page WHERE before < %s ORDER BY {order}")


async def pages(conn: PgConnection, paged: Paged, prefix: str, params: Sequence[object] = ()
                ) -> AsyncIterator[list[tuple[object, ...]]]:
    """The rows of `paged` in primary key order, a page at a time: at most PAGE_ROWS, and
    about PAGE_BYTES (`paged.size`), the page after the row that reaches them, one row at
    least however large; each page from the key the page before ended at."""
    after: tuple[object, ...] = ()
    while True:
        cursor = await conn.execute(paged.query(not after),
                                    (prefix, *params, *after, PAGE_ROWS, PAGE_BYTES))
        page = await cursor.fetchall()
        if not page:
            return
        yield page
        after = tuple(page[-1][:paged.keys])
