"""What a prefix's data is laid out with, checked when a process opens the prefix, so a
setting changed at a restart either works or is refused (LAYOUT_MISMATCH naming the setting,
the stored value and the given one), never leaves data where the new settings do not look
(decision 0073).

- **The partition count** is fixed once the prefix exists (`<prefix>:meta` `partitions`,
  claimed with HSETNX: of two processes opening a new prefix at once with other counts, the
  second is refused, `lifecycle.check_server`).
"""

from __future__ import annotations

from stateworker.errors import LayoutMismatch, shown
from stateworker.settings import Settings


def partitions_differ(settings: Settings, stored: int) -> LayoutMismatch:
    """The refusal of a partition count other than the one the prefix was created with."""
    return LayoutMismatch(
        f"prefix {shown(settings.prefix)} was created with {stored} partitions, not "
        f"{settings.partitions} (partitions, STATEWORKER_PARTITIONS): every scope would be "
        "looked for in another partition than the one that holds it, and events and triggers "
        f"would follow other streams; nothing was written. Use STATEWORKER_PARTITIONS={stored} "
        "for this prefix (fixed once its data exists: a restore into another count is not "
        "offered either)", {"setting": "partitions", "stored": stored,
                            "given": settings.partitions, "prefix": settings.prefix})
