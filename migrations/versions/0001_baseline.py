"""Baseline: the whole schema of sql/schema.sql.

Until the first release this revision applies the current sql/schema.sql,
so the schema has one source; at the release it is frozen (docs/schema.md).

Revision ID: 0001
Revises:
"""

from pgqueue.migrate import run_migration_file

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("schema.sql")


def downgrade() -> None:
    run_migration_file("migrations/0001_baseline.down.sql")
