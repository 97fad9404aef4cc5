"""Notifications for the public event stream (app.subscribe): enqueue names
the job when it was one, and tells scheduled work apart from ready work.

Revision ID: 0009
Revises: 0007
"""

from pgqueue.migrate import run_migration_file

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0009_subscriptions.up.sql")


def downgrade() -> None:
    run_migration_file("0009_subscriptions.down.sql")
