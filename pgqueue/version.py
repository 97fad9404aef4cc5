"""Version of the package and of the database schema it needs."""

__version__ = "0.1.0"

#: The Alembic head revision this code expects (checked by tests against migrations/).
SCHEMA_REVISION = "0009"
