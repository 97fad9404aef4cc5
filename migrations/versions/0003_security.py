"""Least privilege: SECURITY DEFINER enqueue functions with a pinned search_path,
EXECUTE revoked from PUBLIC; the SQL API refuses over-long keys and over-deep payloads.

Revision ID: 0003
Revises: 0002
"""

from pgqueue.migrate import run_migration_file

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0003_security.up.sql")


def downgrade() -> None:
    run_migration_file("0003_security.down.sql")
