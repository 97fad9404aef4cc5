"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against
#: migrations/). Revisions are numbered in the order they apply; 0001 is the
#: baseline that creates sql/schema.sql.
SCHEMA_REVISION = "0001"
