"""Task registry, live task settings, per-task limits, unlimited attempts
(max_attempts = 0) and lost workers.

Revision ID: 0006
Revises: 0010 (0007, 0009, 0005, 0008 and 0010 landed on main first; the chain stays linear)
"""

from pgqueue.migrate import run_migration_file

revision = "0006"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0006_task_registry.up.sql")


def downgrade() -> None:
    run_migration_file("0006_task_registry.down.sql")
