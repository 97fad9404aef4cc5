"""Worker identity: workers record their pgqueue version, and register,
heartbeat and deregister only through SECURITY DEFINER functions fenced by a
per-process secret (the worker role loses its write privilege on workers).

Revision ID: 0013
Revises: 0011
"""

from pgqueue.migrate import run_migration_file

revision = "0013"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0013_worker_identity.up.sql")


def downgrade() -> None:
    run_migration_file("0013_worker_identity.down.sql")
