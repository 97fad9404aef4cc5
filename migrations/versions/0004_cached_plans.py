"""Cached, index-pinned plans for lease_jobs and enqueue_batch instead of
planning every statement on every call.

Revision ID: 0004
Revises: 0003
"""

from pgqueue.migrate import run_migration_file

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0004_cached_plans.up.sql")


def downgrade() -> None:
    run_migration_file("0004_cached_plans.down.sql")
