"""Core queue: jobs, attempts, archive, queues, workers, enqueue and lease functions.

Revision ID: 0001
Revises:
"""

from pgqueue.migrate import run_migration_file

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0001_core.up.sql")


def downgrade() -> None:
    run_migration_file("0001_core.down.sql")
