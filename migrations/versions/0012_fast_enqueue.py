"""A fast path for one job (enqueue_job), and debounce checks its payload's size.

Revision ID: 0012
Revises: 0014
"""

from pgqueue.migrate import run_migration_file

revision = "0012"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0012_fast_enqueue.up.sql")


def downgrade() -> None:
    run_migration_file("0012_fast_enqueue.down.sql")
