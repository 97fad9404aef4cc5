"""The archive partitioned by finish time: convert it online, keep partitions
ahead, drop whole partitions on prune.

A plain ``jobs_archive`` is converted in three steps, each its own short
statement on an autocommit connection, so that reads and archive runs go on
throughout: a NOT VALID bound check on the table and an index that the
partitioned index will adopt (both without blocking writes), the check's
validation (a scan under a lock that still lets readers and writers in), then
one transaction that renames the table, creates the partitioned
``jobs_archive`` in its place and attaches the old table as the partition of
everything archived so far (no scan: the validated check proves the bound).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, get_args

from pgqueue.errors import InvalidOption
from pgqueue.models import ArchiveLayout
from pgqueue.ops import Execute, Op

Period = Literal["day", "week", "month"]
PERIODS: tuple[Period, ...] = get_args(Period)


def period_name(period: object) -> Period:
    """``period`` as one of :data:`PERIODS`, or InvalidOption."""
    for known in PERIODS:
        if period == known:
            return known
    raise InvalidOption(f"invalid partition period {period!r}: one of {', '.join(PERIODS)}")


def layout() -> Op[ArchiveLayout]:
    """Whether the archive is partitioned, by which period, into how many partitions."""
    row = yield Execute("archive_partitioning_get", {}, fetch="one", rows="dict")
    return _layout(row)


def _layout(row: dict[str, Any] | None) -> ArchiveLayout:
    if row is None:
        return ArchiveLayout(partitioned=False, period=None, partitions=0, legacy_upper=None)
    legacy_upper: datetime | None = row["legacy_upper"]
    return ArchiveLayout(
        partitioned=bool(row["partitioned"]),
        period=row["period"],
        partitions=int(row["partitions"]),
        legacy_upper=legacy_upper,
    )


def partition_archive(period: str = "day") -> Op[tuple[ArchiveLayout, bool]]:
    """Convert the archive to partitions of ``period``; returns the layout and
    whether this call converted it (False: it already was). Drive it on an
    autocommit connection: one step builds an index CONCURRENTLY."""
    return _partition_archive(period_name(period))


def _partition_archive(period: Period) -> Op[tuple[ArchiveLayout, bool]]:
    before = yield from layout()
    if before.partitioned:
        if before.period != period:
            raise InvalidOption(
                f"the archive is already partitioned by {before.period}; changing the period "
                "of a partitioned archive is not supported"
            )
        return before, False
    row = yield Execute("archive_partition_prepare", {"period": period}, fetch="one")
    bound = row[0]
    yield Execute("archive_partition_index", {}, fetch="none")
    yield Execute("archive_partition_validate", {}, fetch="none")
    yield Execute("archive_partition_switch", {"period": period, "bound": bound}, fetch="none")
    after = yield from layout()
    return after, True


def ensure_for_archive(params: dict[str, Any]) -> Op[int]:
    """Create the partitions an archive run with these cutoff parameters needs,
    and those of the next two periods."""
    row = yield Execute("archive_partitions_for_archive", params, fetch="one")
    return int(row[0]) if row and row[0] is not None else 0


def drop_older(params: dict[str, Any], max_rows: int | None) -> Op[int]:
    """Drop whole partitions finished before the cutoff; returns the rows dropped."""
    row = yield Execute("archive_partitions_drop", {**params, "max_rows": max_rows}, fetch="one")
    return int(row[0]) if row and row[0] is not None else 0
