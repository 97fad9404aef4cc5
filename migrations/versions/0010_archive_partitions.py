"""The archive may be range-partitioned by finish time: the setting and the
functions that create partitions ahead and drop whole partitions on prune.

Revision ID: 0010
Revises: 0008
"""

from pgqueue.migrate import run_migration_file

revision = "0010"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0010_archive_partitions.up.sql")


def downgrade() -> None:
    run_migration_file("0010_archive_partitions.down.sql")
