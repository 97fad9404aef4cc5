"""Less server work per enqueue: cheaper forms of the jobs CHECK constraints
(parsed and planned anew for every INSERT), no ON CONFLICT without a dedup
key, fewer statements in enqueue_job.

Revision ID: 0017
Revises: 0016
"""

from pgqueue.migrate import run_migration_file

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0017_lean_enqueue.up.sql")


def downgrade() -> None:
    run_migration_file("0017_lean_enqueue.down.sql")
