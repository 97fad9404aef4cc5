"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from pgqueue.migrate import run_migration_file

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("migrations/${up_revision}_CHANGEME.up.sql")


def downgrade() -> None:
    run_migration_file("migrations/${up_revision}_CHANGEME.down.sql")
