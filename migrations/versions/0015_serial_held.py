"""Blocked serial-key jobs are held (jobs.serial_held) and skipped by the lease
through the ready index, so that the lease costs the same however many wait.

Revision ID: 0015
Revises: 0012
"""

from pgqueue.migrate import run_migration_file

revision = "0015"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0015_serial_held.up.sql")


def downgrade() -> None:
    run_migration_file("0015_serial_held.down.sql")
