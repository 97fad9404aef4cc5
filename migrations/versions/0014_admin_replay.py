"""Replay is an admin action: the server-side replay_job, executable by the
schema's owner and admins only.

Revision ID: 0014
Revises: 0013
"""

from pgqueue.migrate import run_migration_file

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0014_admin_replay.up.sql")


def downgrade() -> None:
    run_migration_file("0014_admin_replay.down.sql")
