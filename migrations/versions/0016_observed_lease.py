"""lease_jobs also returns each job's run_at and trace_context, so a worker
keeping metrics or traces leases with one statement, like one that does not.

Revision ID: 0016
Revises: 0015
"""

from pgqueue.migrate import run_migration_file

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0016_observed_lease.up.sql")


def downgrade() -> None:
    run_migration_file("0016_observed_lease.down.sql")
