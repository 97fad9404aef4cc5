"""A leaner hot path: lease_jobs updates the rows it locked by ctid and stages
scheduled jobs only when one is due; ack_jobs is one statement planned once.

Revision ID: 0011
Revises: 0006
"""

from pgqueue.migrate import run_migration_file

revision = "0011"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0011_lean_lease.up.sql")


def downgrade() -> None:
    run_migration_file("0011_lean_lease.down.sql")
