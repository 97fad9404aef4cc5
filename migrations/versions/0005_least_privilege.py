"""Least privilege: validation of every job in the database, fenced SECURITY
DEFINER functions (also the SQL worker API), bounded reaper/completer
arithmetic, lease cost independent of idle queues, recorded grants.

Revision ID: 0005
Revises: 0009 (0007 and 0009 landed on main first)
"""

from pgqueue.migrate import run_migration_file

revision = "0005"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0005_least_privilege.up.sql")


def downgrade() -> None:
    run_migration_file("0005_least_privilege.down.sql")
