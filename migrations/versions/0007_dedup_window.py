"""Uniqueness over time: dedup_window and debounce (enqueue_windowed, the
SQL API's new parameters).

Revision ID: 0007
Revises: 0004
"""

from pgqueue.migrate import run_migration_file

revision = "0007"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0007_dedup_window.up.sql")


def downgrade() -> None:
    run_migration_file("0007_dedup_window.down.sql")
