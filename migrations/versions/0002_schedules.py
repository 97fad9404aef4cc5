"""Cron schedules: the schedules table and its change notification.

Revision ID: 0002
Revises: 0001
"""

from pgqueue.migrate import run_migration_file

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0002_schedules.up.sql")


def downgrade() -> None:
    run_migration_file("0002_schedules.down.sql")
