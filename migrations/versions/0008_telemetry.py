"""The W3C trace context of each job (OpenTelemetry): a jobs column, enqueue_batch_traced,
and a traceparent parameter of the SQL enqueue().

Revision ID: 0008
Revises: 0005
"""

from pgqueue.migrate import run_migration_file

revision = "0008"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_migration_file("0008_telemetry.up.sql")


def downgrade() -> None:
    run_migration_file("0008_telemetry.down.sql")
